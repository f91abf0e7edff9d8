#!/usr/bin/env bash
# Build, push and deploy atefleet to the current kubectl context, next to an installed Agent
# Substrate; or tear it down. Usage: manifests/install.sh --help. docs/deploy.md explains the files.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MANIFESTS="${ROOT}/manifests"
NAMESPACE="atefleet"
SECRET="atefleet-secrets"
# The off-GCP pause image Substrate's ActorTemplate CRD names (the sandbox's root container; the
# CRD requires it digest-pinned, as changing it invalidates snapshots).
PAUSE_IMAGE="${ATE_ENV_PAUSE_IMAGE:-registry.k8s.io/pause:3.10.2@sha256:f548e0e8e3dc1896ca956272154dde3314e8cc4fde0a57577ee9fa1c63f5baf4}"
[[ "${PAUSE_IMAGE}" == *@sha256:* ]] || { echo "error: ATE_ENV_PAUSE_IMAGE must be digest-pinned (name@sha256:...): ${PAUSE_IMAGE}" >&2; exit 1; }

if [[ -n "${GOOGLE_PROJECT_ID:-}" && -z "${ATE_ENV_IMAGE_REPO:-}" ]]; then
  ATE_ENV_IMAGE_REPO="gcr.io/${GOOGLE_PROJECT_ID}"
fi

usage() {
  cat <<'EOF'
Usage: manifests/install.sh [options]

Options:
  --deploy             Build and push the fleet and guest images, then deploy atefleet
  --delete             Delete atefleet (its namespace, including Redis data) and its ActorTemplate/WorkerPool
  --deploy-ate-env     Same as --deploy (seed 000's name)
  --delete-ate-env     Same as --delete (seed 000's name)
  --render             Print the manifests with images and placeholders filled in (no build, no cluster)
  -h, --help           Show this help

Environment variables:
  GOOGLE_PROJECT_ID           Push images to gcr.io/$GOOGLE_PROJECT_ID
  ATE_ENV_IMAGE_REPO          Registry to push images to (overrides GOOGLE_PROJECT_ID)
  ATE_ENV_IMAGE               Prebuilt digest-pinned fleet image (skips building Dockerfile)
  ATE_ENV_GUEST_IMAGE         Prebuilt digest-pinned guest image (skips building Dockerfile.guest)
  ATEOM_IMAGE                 Substrate's worker (ateom) image for workerpool.yaml; unset: the pool is not created
  ATE_ENV_SNAPSHOT_LOCATION   Snapshot prefix for actortemplate.yaml (e.g. gs://bucket/atefleet/); unset: the template is not created
  ATE_ENV_PAUSE_IMAGE         Digest-pinned pause image for actortemplate.yaml (default: registry.k8s.io's pause 3.10.2;
                              on GKE Substrate's CRD names gcr.io/gke-release/pause@sha256:...)
  ATE_ENV_EXTERNAL_REDIS_URL  Use this Redis instead of deploying redis.yaml (only when the Secret is created)
  KUBECTL_CONTEXT             kubectl context (default: the current one)
  ATE_ENV_WAIT_TIMEOUT        Rollout wait timeout (default 5m)
EOF
}

log_step() { printf '\033[1;36m[step]: %s\033[0m\n' "$1" >&2; }
warn() { printf '\033[1;33mwarning: %s\033[0m\n' "$1" >&2; }
die() { printf 'error: %s\n' "$1" >&2; exit 1; }

run_kubectl() { kubectl ${KUBECTL_CONTEXT:+--context="${KUBECTL_CONTEXT}"} "$@"; }

# build_image NAME DOCKERFILE: builds and pushes ${ATE_ENV_IMAGE_REPO}/NAME with podman or docker
# and prints its digest-pinned reference (Substrate requires pinned actor images).
build_image() {
  local name="$1" dockerfile="$2" tool image digest
  [[ -n "${ATE_ENV_IMAGE_REPO:-}" ]] || die "set ATE_ENV_IMAGE_REPO or GOOGLE_PROJECT_ID (or ATE_ENV_IMAGE and ATE_ENV_GUEST_IMAGE)"
  if command -v podman >/dev/null 2>&1; then tool=podman
  elif command -v docker >/dev/null 2>&1; then tool=docker
  else die "neither podman nor docker was found in PATH"; fi
  image="${ATE_ENV_IMAGE_REPO}/${name}:latest"
  log_step "build ${image} from ${dockerfile} (${tool})"
  "${tool}" build --platform=linux/amd64 -f "${ROOT}/${dockerfile}" -t "${image}" "${ROOT}" >&2
  if [[ "${tool}" == podman ]]; then
    local digest_file; digest_file="$(mktemp)"
    podman push --digestfile "${digest_file}" "${image}" >&2
    digest="$(cat "${digest_file}")"; rm -f "${digest_file}"
  else
    docker push "${image}" >&2
    digest="$(docker inspect --format='{{if .RepoDigests}}{{index .RepoDigests 0}}{{end}}' "${image}")"
    digest="${digest##*@}"
  fi
  [[ "${digest}" == sha256:* ]] || die "${tool} did not report a digest for ${image} (got '${digest}')"
  echo "${ATE_ENV_IMAGE_REPO}/${name}@${digest}"
}

resolve_images() {
  FLEET_IMAGE="${ATE_ENV_IMAGE:-}"
  GUEST_IMAGE="${ATE_ENV_GUEST_IMAGE:-}"
  [[ -n "${FLEET_IMAGE}" ]] || FLEET_IMAGE="$(build_image atefleet Dockerfile)"
  [[ -n "${GUEST_IMAGE}" ]] || GUEST_IMAGE="$(build_image atefleet-guest Dockerfile.guest)"
  [[ "${GUEST_IMAGE}" == *@sha256:* ]] || die "the guest image must be digest-pinned (name@sha256:...): ${GUEST_IMAGE}"
}

# render FILE: the manifest with install-time placeholders filled in.
render() {
  sed -e "s|\${FLEET_IMAGE}|${FLEET_IMAGE}|g" \
      -e "s|\${GUEST_IMAGE}|${GUEST_IMAGE}|g" \
      -e "s|\${ATEOM_IMAGE}|${ATEOM_IMAGE:-}|g" \
      -e "s|\${SNAPSHOT_LOCATION}|${ATE_ENV_SNAPSHOT_LOCATION:-}|g" \
      -e "s|\${PAUSE_IMAGE}|${PAUSE_IMAGE}|g" \
      "${MANIFESTS}/$1"
}

# The fleet's own objects, in apply order (secret.yaml and redis.yaml are handled apart).
FLEET_FILES=(namespace.yaml serviceaccount.yaml configmap.yaml api.yaml worker.yaml reconciler.yaml webhooks.yaml)

# Substrate objects this install adds, each only when its placeholder has a value.
substrate_files() {
  if [[ -n "${ATE_ENV_SNAPSHOT_LOCATION:-}" ]]; then echo actortemplate.yaml
  else warn "ATE_ENV_SNAPSHOT_LOCATION unset: actortemplate.yaml not applied; sessions fail until template default-env-template exists in namespace default"; fi
  if [[ -n "${ATEOM_IMAGE:-}" ]]; then echo workerpool.yaml
  else warn "ATEOM_IMAGE unset: workerpool.yaml not applied; a WorkerPool labelled atefleet.dev/pool=atefleet-guest must exist"; fi
}

random_hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
sha256_hex() {
  if command -v sha256sum >/dev/null 2>&1; then printf %s "$1" | sha256sum | cut -d' ' -f1
  else printf %s "$1" | shasum -a 256 | cut -d' ' -f1; fi
}

# ensure_secret: keep an existing Secret; else apply secret.yaml if it was filled in; else create
# one with fresh random values.
ensure_secret() {
  if run_kubectl -n "${NAMESPACE}" get secret "${SECRET}" >/dev/null 2>&1; then
    echo "Secret ${SECRET} exists; keeping it" >&2
  elif ! grep -q REPLACE_ME "${MANIFESTS}/secret.yaml"; then
    run_kubectl apply -f "${MANIFESTS}/secret.yaml"
  else
    create_generated_secret
  fi
}

# create_generated_secret: the Secret with a random API key (printed once; only its SHA-256 is
# stored), env-variable sealing key, Redis password and webhook secret. It runs in a subshell, so
# its temp dir goes away on any exit.
create_generated_secret() (
  log_step "create Secret ${SECRET} with generated values"
  dir="$(mktemp -d)"
  trap 'rm -rf "${dir}"' EXIT
  chmod 700 "${dir}"
  api_key="afk_$(random_hex)"
  redis_password="$(random_hex)"
  secrets_key="$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
  redis_url="${ATE_ENV_EXTERNAL_REDIS_URL:-redis://:${redis_password}@redis.${NAMESPACE}.svc:6379/0}"
  webhook_secret="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
  cat >"${dir}/secrets.yaml" <<EOF
auth:
  api_keys:
    - name: "agent-runtime"
      sha256: "$(sha256_hex "${api_key}")"
webhooks:
  secrets:
    default: "${webhook_secret}"
EOF
  printf %s "${secrets_key}" >"${dir}/secrets-key"
  printf %s "${redis_password}" >"${dir}/redis-password"
  printf %s "${redis_url}" >"${dir}/redis-url"
  run_kubectl -n "${NAMESPACE}" create secret generic "${SECRET}" \
    --from-file=secrets.yaml="${dir}/secrets.yaml" \
    --from-file=secrets-key="${dir}/secrets-key" \
    --from-file=redis-password="${dir}/redis-password" \
    --from-file=redis-url="${dir}/redis-url"
  run_kubectl -n "${NAMESPACE}" label secret "${SECRET}" app.kubernetes.io/part-of=atefleet >/dev/null
  printf '\nGenerated API key (shown once; only its SHA-256 is stored):\n  %s\n\n' "${api_key}" >&2
)

uses_in_cluster_redis() {
  # The generated Secret points at the external URL when one was given; otherwise deploy Redis.
  [[ -z "${ATE_ENV_EXTERNAL_REDIS_URL:-}" ]]
}

deploy() {
  command -v kubectl >/dev/null 2>&1 || die "kubectl not found"
  resolve_images
  echo "Fleet image: ${FLEET_IMAGE}" >&2
  echo "Guest image: ${GUEST_IMAGE}" >&2
  log_step "apply namespace and service account"
  render namespace.yaml | run_kubectl apply -f -
  render serviceaccount.yaml | run_kubectl apply -f -
  ensure_secret
  if uses_in_cluster_redis; then
    log_step "apply redis"
    render redis.yaml | run_kubectl apply -f -
  fi
  log_step "apply the fleet"
  local f
  for f in "${FLEET_FILES[@]:2}"; do render "${f}" | run_kubectl apply -f -; done
  log_step "apply the Substrate ActorTemplate / WorkerPool"
  for f in $(substrate_files); do
    render "${f}" | run_kubectl apply -f - \
      || die "the cluster rejected ${f}: is Agent Substrate installed (CRDs ate.dev/v1alpha1)? An ActorTemplate's spec is immutable: a new guest image needs a new template name"
  done
  log_step "wait for the rollout (timeout ${ATE_ENV_WAIT_TIMEOUT:-5m})"
  if uses_in_cluster_redis; then
    run_kubectl -n "${NAMESPACE}" rollout status statefulset/redis --timeout="${ATE_ENV_WAIT_TIMEOUT:-5m}"
  fi
  for f in api worker reconciler webhooks; do
    run_kubectl -n "${NAMESPACE}" rollout status "deployment/atefleet-${f}" --timeout="${ATE_ENV_WAIT_TIMEOUT:-5m}"
  done
  echo "" >&2
  echo "Reach the API locally (optional):" >&2
  echo "  kubectl port-forward -n ${NAMESPACE} svc/atefleet-api 7777:7777" >&2
}

delete() {
  command -v kubectl >/dev/null 2>&1 || die "kubectl not found"
  warn "Substrate actors (and their snapshots) of existing sessions are not deleted; destroy sessions first (atefleet sessions destroy ...)"
  log_step "delete the Substrate ActorTemplate / WorkerPool"
  run_kubectl delete --ignore-not-found -f "${MANIFESTS}/workerpool.yaml" || warn "could not delete workerpool.yaml"
  run_kubectl delete --ignore-not-found -f "${MANIFESTS}/actortemplate.yaml" || warn "could not delete actortemplate.yaml"
  log_step "delete namespace ${NAMESPACE} (the fleet, its Secret and the in-cluster Redis data)"
  run_kubectl delete namespace "${NAMESPACE}" --ignore-not-found
}

render_all() {
  FLEET_IMAGE="${ATE_ENV_IMAGE:-}"
  GUEST_IMAGE="${ATE_ENV_GUEST_IMAGE:-}"
  [[ -n "${FLEET_IMAGE}" && -n "${GUEST_IMAGE}" ]] || die "--render needs ATE_ENV_IMAGE and ATE_ENV_GUEST_IMAGE"
  local f first=1 redis=redis.yaml
  uses_in_cluster_redis || redis=""
  for f in "${FLEET_FILES[@]}" ${redis} $(substrate_files); do
    [[ ${first} -eq 1 ]] || echo "---"
    first=0
    render "${f}"
  done
}

if [[ $# -eq 0 ]]; then usage; exit 1; fi
for arg in "$@"; do
  case "${arg}" in -h|--help) usage; exit 0 ;; esac
done
while [[ $# -gt 0 ]]; do
  case "$1" in
    --deploy|--deploy-ate-env) deploy ;;
    --delete|--delete-ate-env) delete ;;
    --render) render_all ;;
    *) echo "error: unknown option: $1" >&2; usage >&2; exit 1 ;;
  esac
  shift
done
