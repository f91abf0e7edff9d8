"""Deployment files agree with the code: Dockerfiles, docker-compose.yml and manifests/.

No container engine or cluster is available to the test suite, so these checks are static: every
YAML file parses; the config the files hand to the fleet validates with the fleet's own schema;
and every role, flag, environment variable, port and image they name is one the code provides.
install.sh itself is exercised in test_deploy_install_sh.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.config import ENV_OVERRIDES, Config, parse_config, parse_listen
from common.secret_box import KEY_ENV

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILES = (ROOT / "Dockerfile", ROOT / "Dockerfile.guest")
YAML_FILES = (COMPOSE, *sorted(MANIFESTS.glob("*.yaml")))

#: Every port a deployment file may name, and where the code or platform defines it.
KNOWN_PORTS: dict[int, str] = {
    7777: "the API (config `listen` default)",
    9100: "--metrics-port of the non-API roles",
    80: "the guest inside an actor (atenet router target)",
    6379: "Redis",
    50051: "local Substrate gRPC in docker-compose.yml",
    443: "Substrate's Control API (api.ate-system.svc:443)",
}

#: Files that name ports for sure: finding none there means the port extraction broke.
FILES_WITH_PORTS = {"docker-compose.yml", "api.yaml", "worker.yaml", "redis.yaml", "actortemplate.yaml"}

#: Images a deployment file may name: install.sh placeholders for our two Dockerfiles, the compose
#: tag of the fleet image, Redis, and Substrate's own worker and pause images.
KNOWN_IMAGES = {"${FLEET_IMAGE}", "${GUEST_IMAGE}", "atefleet:latest", "redis:7", "${ATEOM_IMAGE}",
                "${PAUSE_IMAGE}"}

#: Runs the CLI's entry point (the console script may not be on PATH in the test environment).
RUN_CLI = "import sys; from atefleet.cli import main; sys.exit(main())"

#: Global options of the CLI that may precede the role.
GLOBAL_OPTIONS_WITH_VALUE = {"--config"}


# --- loading -------------------------------------------------------------------------------------


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(MANIFESTS.glob("*.yaml")) for d in load_docs(p)]


def k8s_doc(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name} in manifests/, found {len(found)}"
    return found[0]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in k8s_docs():
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def fleet_deployments() -> dict[str, dict[str, Any]]:
    """Pod specs of the fleet's own Deployments (api, worker, reconciler, webhooks) by name."""
    return {
        name: spec for name, spec in pod_specs()
        if any(c["image"] == "${FLEET_IMAGE}" for c in spec["containers"])
    }


def compose() -> dict[str, Any]:
    return load_docs(COMPOSE)[0]


def compose_fleet_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if s["image"] == "atefleet:latest"}


def configmap_config_text() -> str:
    text: str = k8s_doc("ConfigMap", "atefleet-config")["data"]["config.yaml"]
    return text


def secret_config_text() -> str:
    text: str = k8s_doc("Secret", "atefleet-secrets")["stringData"]["secrets.yaml"]
    return text


def joined_config() -> Config:
    """The config a pod reads: the init container's join of the ConfigMap and Secret files."""
    return parse_config(yaml.safe_load(configmap_config_text() + "\n" + secret_config_text()))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def dockerfile_argv(path: Path) -> list[str]:
    """The final stage's ENTRYPOINT + CMD (exec form)."""
    instr = dockerfile_instructions(path)
    entry = [json.loads(a) for i, a in instr if i == "ENTRYPOINT"][-1]
    cmd = [json.loads(a) for i, a in instr if i == "CMD"][-1]
    return [*entry, *cmd]


# --- the commands the files run ------------------------------------------------------------------


def _from_atefleet(argv: list[str]) -> list[str] | None:
    return argv[argv.index("atefleet"):] if "atefleet" in argv else None


def fleet_commands() -> dict[str, list[str]]:
    """Every `atefleet ...` command line the deployment files run, by where it is."""
    found: dict[str, list[str]] = {}
    for name, svc in compose()["services"].items():
        if svc["image"] == "atefleet:latest":
            found[f"compose {name}"] = ["atefleet", *svc["command"]]
    for name, spec in pod_specs():
        for c in spec.get("initContainers", []) + spec["containers"]:
            argv = _from_atefleet([*c.get("command", []), *c.get("args", [])])
            if argv:
                found[f"manifest {name}/{c['name']}"] = argv
    for c in k8s_doc("ActorTemplate", "default-env-template")["spec"]["containers"]:
        argv = _from_atefleet([*c.get("command", []), *c.get("args", [])])
        if argv:
            found[f"actortemplate {c['name']}"] = argv
    for path in DOCKERFILES:
        argv = _from_atefleet(dockerfile_argv(path))
        if argv:
            found[path.name] = argv
    return found


def role_and_flags(argv: list[str]) -> tuple[str, list[str]]:
    """`atefleet [--config P] ROLE [--flag v ...]` -> (ROLE, [--flag, ...])."""
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in GLOBAL_OPTIONS_WITH_VALUE else rest[1:]
    assert rest, f"no role in {argv}"
    return rest[0], [a for a in rest[1:] if a.startswith("--")]


def cli_roles() -> tuple[str, ...]:
    try:
        from atefleet.cli import ROLES
    except ImportError as err:
        pytest.fail(f"atefleet.cli.ROLES is missing ({err}): the CLI must define ROLES: tuple[str, ...]")
    roles: tuple[str, ...] = ROLES
    return roles


# --- YAML ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_yaml_parses(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)


@pytest.mark.parametrize("path", sorted(MANIFESTS.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_objects_are_complete(path: Path) -> None:
    for doc in load_docs(path):
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path.name}: {doc.get('kind')}"
        assert doc["metadata"].get("name")
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace"), f"{path.name}: {doc['kind']} has no namespace"


# --- config ----------------------------------------------------------------------------------------


def test_configmap_config_validates_and_targets_the_cluster() -> None:
    cfg = parse_config(yaml.safe_load(configmap_config_text()))
    assert cfg.ate.ateapi == "api.ate-system.svc:443"
    assert cfg.ate.tls.enabled and cfg.ate.tls.ca_file and cfg.ate.token_file
    assert cfg.redis.url == "", "the Redis URL (with its password) must come from the Secret"


def test_secret_part_shares_no_top_level_key_with_configmap() -> None:
    # The init container concatenates the two files: a shared key would silently override.
    base = yaml.safe_load(configmap_config_text())
    secret = yaml.safe_load(secret_config_text())
    assert not base.keys() & secret.keys()
    assert "auth" not in base and "webhooks" not in base


def test_joined_config_validates_with_auth_enabled() -> None:
    cfg = joined_config()
    assert cfg.auth.enabled, "the API listens off loopback in a cluster, so auth must be configured"
    assert cfg.webhooks.secrets


def test_cluster_environments_match_the_repository_config() -> None:
    # The seed's curl examples must work against the cluster as they do against `make run`.
    local = parse_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    assert joined_config().environments == local.environments


def test_every_environment_has_an_actor_template() -> None:
    templates = {(d["metadata"]["namespace"], d["metadata"]["name"])
                 for d in k8s_docs() if d["kind"] == "ActorTemplate"}
    for env in joined_config().environments:
        # The fleet creates actors with actor_template_namespace = the environment's atespace.
        assert (env.atespace, env.template) in templates, env.name


def test_worker_pool_matches_template_selector() -> None:
    template = k8s_doc("ActorTemplate", "default-env-template")
    pool = k8s_doc("WorkerPool", "atefleet-guest-pool")
    wanted = template["spec"]["workerSelector"]["matchLabels"]
    assert wanted.items() <= pool["metadata"]["labels"].items()
    assert pool["metadata"]["namespace"] == template["metadata"]["namespace"]


def test_compose_config_validates() -> None:
    mounts = [v for s in compose_fleet_services().values() for v in s["volumes"]]
    assert "./config.yaml:/etc/atefleet/config.yaml:ro" in mounts
    parse_config(yaml.safe_load((ROOT / "config.yaml").read_text()))


def test_pods_read_the_config_the_init_container_writes() -> None:
    for name, spec in fleet_deployments().items():
        (init,) = spec["initContainers"]
        written = re.search(r">\s*(\S+config\.yaml)\s*$", init["command"][-1])
        assert written, f"{name}: init container writes no config.yaml"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["ATEFLEET_CONFIG"] == written.group(1), name
        assert "secrets.yaml" in init["command"][-1] and "config.yaml" in init["command"][-1]


# --- Control API credentials -----------------------------------------------------------------------


def _projected_sources(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["projected"]["sources"][0] for v in spec["volumes"] if "projected" in v}


def _mount_dirs(spec: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize("name", ["atefleet-worker", "atefleet-reconciler"])
def test_substrate_clients_mount_token_and_ca_where_config_points(name: str) -> None:
    spec, ate = fleet_deployments()[name], joined_config().ate
    sources, mounts = _projected_sources(spec), _mount_dirs(spec)
    token = sources["ateapi-token"]["serviceAccountToken"]
    assert token["audience"] == "api.ate-system.svc"
    assert f"{mounts['ateapi-token']}/{token['path']}" == ate.token_file
    bundle = sources["servicedns-ca"]["clusterTrustBundle"]
    assert f"{mounts['servicedns-ca']}/{bundle['path']}" == ate.tls.ca_file
    assert spec["serviceAccountName"] == "atefleet"


@pytest.mark.parametrize("name", ["atefleet-api", "atefleet-webhooks"])
def test_roles_that_never_call_substrate_get_no_token(name: str) -> None:
    assert "ateapi-token" not in _projected_sources(fleet_deployments()[name])


# --- roles, flags, env vars ------------------------------------------------------------------------


def test_every_named_role_is_a_cli_role() -> None:
    roles = cli_roles()
    named = set()
    for where, argv in fleet_commands().items():
        role, _ = role_and_flags(argv)
        assert role in roles, f"{where}: `atefleet {role}` is not a CLI role {roles}"
        named.add(role)
    assert named == set(roles), f"roles no deployment file runs: {sorted(set(roles) - named)}"


def test_every_fleet_command_line_parses() -> None:
    # Each command line runs with --help appended: the CLI parses all of it (flags and their
    # values) and prints the role's help instead of starting the role.
    cli_roles()  # fails clearly first when the CLI is not there yet
    for argv in sorted({tuple(a) for a in fleet_commands().values()}):
        _, flags = role_and_flags(list(argv))
        run = subprocess.run([sys.executable, "-c", RUN_CLI, *argv[1:], "--help"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert run.returncode == 0, f"`{shlex.join(argv)}` does not parse: {run.stderr.strip()[-300:]}"
        missing = sorted(f for f in flags if f not in run.stdout)
        assert not missing, f"`{shlex.join(argv)} --help` does not list {missing}"


def test_every_atefleet_env_var_is_read_by_the_code() -> None:
    known = set(ENV_OVERRIDES) | {"ATEFLEET_CONFIG", KEY_ENV}
    for path in (*YAML_FILES, *DOCKERFILES, MANIFESTS / "install.sh"):
        named = set(re.findall(r"\bATEFLEET_[A-Z0-9_]+", path.read_text()))
        assert named <= known, f"{path.name} names {sorted(named - known)}, not in ENV_OVERRIDES"


def test_api_and_workers_share_the_sealing_key() -> None:
    # The API seals env_variables with it and the workers open them: one key from the Secret.
    refs = {}
    for name, spec in fleet_deployments().items():
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        if KEY_ENV in env:
            refs[name] = env[KEY_ENV]["valueFrom"]["secretKeyRef"]
    assert set(refs) == {"atefleet-api", "atefleet-worker"}
    assert all(r == {"name": "atefleet-secrets", "key": "secrets-key"} for r in refs.values())
    assert "secrets-key" in k8s_doc("Secret", "atefleet-secrets")["stringData"]


def test_fleet_containers_get_the_redis_url() -> None:
    for name, svc in compose_fleet_services().items():
        assert svc["environment"]["ATEFLEET_REDIS_URL"].startswith("redis://"), name
    for name, spec in fleet_deployments().items():
        env = {e["name"]: e for e in spec["containers"][0]["env"]}
        ref = env["ATEFLEET_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "atefleet-secrets", "key": "redis-url"}, name


# --- ports -----------------------------------------------------------------------------------------


def _strings_and_ports(node: Any, key: str = "") -> Iterator[int]:
    """Ports in a parsed YAML tree: port-valued keys, `host:port` in strings, --metrics-port N."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings_and_ports(v, str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if v == "--metrics-port" and i + 1 < len(node):
                yield int(node[i + 1])
            yield from _strings_and_ports(v, key)
    elif isinstance(node, int) and key in ("containerPort", "port", "targetPort"):
        yield node
    elif isinstance(node, str):
        yield from (int(p) for p in re.findall(r":(\d{2,5})\b", node))
        if key == "prometheus.io/port":
            yield int(node)


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: p.name)
def test_every_port_is_one_the_code_uses(path: Path) -> None:
    ports = {p for doc in load_docs(path) for p in _strings_and_ports(doc)}
    if path.name in FILES_WITH_PORTS:
        assert ports, f"{path.name}: no port found, so this check would prove nothing"
    unknown = sorted(ports - KNOWN_PORTS.keys())
    assert not unknown, f"{path.name} names ports {unknown} that no code uses"


def test_api_port_is_the_configured_one() -> None:
    assert parse_listen(Config().listen)[1] == 7777
    listen_port = joined_config().listen_host_port[1]
    spec = fleet_deployments()["atefleet-api"]
    assert spec["containers"][0]["ports"][0]["containerPort"] == listen_port
    assert "127.0.0.1:7777:7777" in compose()["services"]["api"]["ports"]


def test_guest_serves_port_80_with_readyz_everywhere() -> None:
    (container,) = k8s_doc("ActorTemplate", "default-env-template")["spec"]["containers"]
    argv = _from_atefleet(container["command"]) or []
    assert argv[argv.index("--listen") + 1] == "0.0.0.0:80"
    assert container["readyz"]["httpGet"] == {"path": "/readyz", "port": 80}
    guest = dockerfile_argv(ROOT / "Dockerfile.guest")
    assert guest[guest.index("--listen") + 1] == "0.0.0.0:80"
    assert container["command"] == guest, "the template and the image must start the guest the same way"
    assert "127.0.0.1:80/readyz" in (ROOT / "Dockerfile.guest").read_text()


# --- images and Dockerfiles ------------------------------------------------------------------------


def _images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("image", "ateomImage", "pauseImage") and isinstance(v, str):
                yield v
            else:
                yield from _images(v)
    elif isinstance(node, list):
        for v in node:
            yield from _images(v)


def test_every_image_is_built_here_or_known() -> None:
    images = {i for p in YAML_FILES for d in load_docs(p) for i in _images(d)}
    assert images <= KNOWN_IMAGES, f"unknown images {sorted(images - KNOWN_IMAGES)}"
    assert compose()["services"]["api"]["build"]["dockerfile"] == "Dockerfile"
    install = (MANIFESTS / "install.sh").read_text()
    assert "build_image atefleet Dockerfile)" in install
    assert "build_image atefleet-guest Dockerfile.guest)" in install


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_existing_files_and_runs_atefleet(path: Path) -> None:
    instr = dockerfile_instructions(path)
    assert [a for i, a in instr if i == "FROM"][-1] == "python:3.11-slim"
    for i, args in instr:
        if i == "COPY" and "--from=" not in args:
            for src in shlex.split(args)[:-1]:
                assert (ROOT / src).exists(), f"{path.name}: COPY source {src} does not exist"
    assert "atefleet" in dockerfile_argv(path)


def test_fleet_image_runs_as_non_root() -> None:
    users = [a for i, a in dockerfile_instructions(ROOT / "Dockerfile") if i == "USER"]
    assert users and not users[-1].startswith(("0", "root"))


def test_build_context_keeps_what_the_package_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = [project["project"]["readme"], "pyproject.toml"]
    needed += [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for name in needed:
        assert (ROOT / name).exists(), f"{name} is needed to build the package but does not exist"
        assert name not in ignored, f".dockerignore drops {name}, which the package build needs"
    assert {".venv", ".state", ".git"} <= ignored


# --- compose ---------------------------------------------------------------------------------------


def test_compose_services() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "local-substrate", "api", "worker", "reconciler", "webhooks"}
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert "--requirepass" in redis_cmd
    assert services["worker"]["deploy"]["replicas"] == 2
    privileged = sorted(n for n, s in services.items() if s.get("privileged"))
    assert privileged == ["local-substrate"], "only the local Substrate needs namespaces"


# --- Kubernetes hardening --------------------------------------------------------------------------


def test_fleet_pods_are_non_root_and_locked_down() -> None:
    for name, spec in fleet_deployments().items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name


def test_expected_fleet_deployments() -> None:
    deployments = fleet_deployments()
    assert set(deployments) == {"atefleet-api", "atefleet-worker", "atefleet-reconciler", "atefleet-webhooks"}
    replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in k8s_docs() if d["kind"] == "Deployment"}
    assert replicas["atefleet-reconciler"] == 2, "a standby reconciler takes over the Redis leader lease"
    hpa = k8s_doc("HorizontalPodAutoscaler", "atefleet-api")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "atefleet-api"


# --- docs ------------------------------------------------------------------------------------------


def test_deploy_doc_describes_every_file() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    files = [p.name for p in MANIFESTS.iterdir()]
    files += ["docker-compose.yml", "Dockerfile.guest", ".dockerignore"]
    missing = [f for f in files if f not in doc]
    assert not missing, f"docs/deploy.md does not mention {missing}"
