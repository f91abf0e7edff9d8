#!/usr/bin/env bash
# The README's Quickstart as a new user runs it: `make run` in this checkout, then seed 000's curl
# sequence (resume, a bash call with env_variables, suspend), then resume again and read a file
# written before the suspend. Fails on any 5xx or wrong answer; stops the fleet as Ctrl-C does.
# Usage: .ci/seed_smoke.sh PYTHON  (run as the user under test, from the checkout's root).
# SMOKE_PORT (default 7777) picks the API port; SMOKE_UP_TIMEOUT_S bounds install + start.
set -euo pipefail
PY="${1:?usage: seed_smoke.sh PYTHON}"
PORT="${SMOKE_PORT:-7777}"
UP_TIMEOUT_S="${SMOKE_UP_TIMEOUT_S:-900}"
API="http://127.0.0.1:${PORT}"
SESSION_ID=123e4567-e89b-12d3-a456-426614174000
BASE="${API}/v1/environments/my-env/sessions/${SESSION_ID}"
LOG="$(mktemp -t atefleet-smoke.XXXXXX.log)"
FLEET_PID=""

stop_fleet() {
  [[ -n "${FLEET_PID}" ]] || return 0
  # make and everything under it share one process group (setsid below): SIGINT to the group is
  # what Ctrl-C in a terminal sends.
  kill -INT -- "-${FLEET_PID}" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 -- "-${FLEET_PID}" 2>/dev/null || break; sleep 1; done
  if kill -0 -- "-${FLEET_PID}" 2>/dev/null; then
    echo "smoke: the fleet did not stop within 60 s of SIGINT" >&2
    kill -KILL -- "-${FLEET_PID}" 2>/dev/null || true
    FLEET_PID=""
    return 1
  fi
  FLEET_PID=""
}
trap 'stop_fleet || true' EXIT

fail() {
  echo "smoke: FAILED: $1" >&2
  echo "---- last lines of the fleet's log (${LOG}):" >&2
  tail -c 6000 "${LOG}" >&2 || true
  exit 1
}

# call NAME METHOD PATH [BODY]: prints the body; fails on a 5xx or a refused connection.
call() {
  local name="$1" method="$2" url="$3" body="${4:-}" out code
  out="$(mktemp)"
  if [[ -n "${body}" ]]; then
    code="$(curl -sS -o "${out}" -w '%{http_code}' -X "${method}" "${url}" \
      -H 'Content-Type: application/json' -d "${body}")" || fail "${name}: curl could not reach ${url}"
  else
    code="$(curl -sS -o "${out}" -w '%{http_code}' -X "${method}" "${url}")" || fail "${name}: curl could not reach ${url}"
  fi
  echo "smoke: ${name}: HTTP ${code}: $(head -c 400 "${out}")" >&2
  [[ "${code}" == 2* ]] || fail "${name} answered HTTP ${code}"
  cat "${out}"; rm -f "${out}"
}

# expect NAME JSON PYTHON-EXPRESSION-OVER-d: fails unless the expression is true.
expect() {
  "${PY}" -c 'import json, sys; d = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' \
    "$2" "$3" || fail "$1: answer does not satisfy: $3"
}

echo "smoke: make run PY=${PY} as $(id -un) in $(pwd), API on ${PORT}"
ATEFLEET_LISTEN=":${PORT}" setsid make run PY="${PY}" >"${LOG}" 2>&1 </dev/null &
FLEET_PID=$!
deadline=$((SECONDS + UP_TIMEOUT_S))
# Up means the banner is printed and the API answers /readyz (the banner can come first).
until grep -q "atefleet is up" "${LOG}" 2>/dev/null \
    && [[ "$(curl -s -o /dev/null -w '%{http_code}' "${API}/readyz")" == 200 ]]; do
  kill -0 "${FLEET_PID}" 2>/dev/null || fail "make run exited before the fleet was up"
  (( SECONDS < deadline )) || fail "the fleet was not up within ${UP_TIMEOUT_S} s"
  sleep 1
done
echo "smoke: up after ${SECONDS} s"
grep -A4 "atefleet is up" "${LOG}" || true

r="$(call resume POST "${BASE}/resume")"
expect resume "${r}" 'd["status"] == "ok"'
r="$(call "bash with env_variables" POST "${BASE}" \
  '{"env_variables":[{"name":"MY_SECRET","value":"c3ebfdfdk12345..."}],"call_id":"c1","type":"function_call","function":{"name":"bash","arguments":"{\"command\":\"uname -a; echo secret=$MY_SECRET; echo kept > before-suspend.txt\"}"}}')"
expect "bash with env_variables" "${r}" \
  'd["type"] == "function_call_output" and d["call_id"] == "c1" and "Linux" in d["output"] and "secret=c3ebfdfdk12345..." in d["output"]'
r="$(call suspend POST "${BASE}/suspend")"
expect suspend "${r}" 'd["status"] == "ok"'
r="$(call "resume again" POST "${BASE}/resume")"
expect "resume again" "${r}" 'd["status"] == "ok"'
r="$(call "read the file written before the suspend" POST "${BASE}" \
  '{"call_id":"c2","type":"function_call","function":{"name":"read_file","arguments":"{\"path\":\"before-suspend.txt\"}"}}')"
expect "read after resume" "${r}" 'd["call_id"] == "c2" and "kept" in d["output"]'
r="$(call "suspend again" POST "${BASE}/suspend")"
expect "suspend again" "${r}" 'd["status"] == "ok"'

stop_fleet || fail "the fleet did not stop cleanly"
grep -q "atefleet: stopped" "${LOG}" || fail "the fleet's log does not say it stopped"
echo "smoke: seed 000 sequence passed; the fleet stopped cleanly"
