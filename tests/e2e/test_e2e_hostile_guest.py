"""A hostile tenant against `atefleet up`, through the real path (API → queue → worker → local
Substrate → sandbox), at both sandbox levels: it cannot put its program where the guest runs, read
the fleet's secrets or config, or reach the fleet's loopback services; /healthz and the banner say
what isolation is in force; a batch accepts only the session ids every other route accepts."""

from __future__ import annotations

import base64
import json
import os
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SANDBOX_LEVELS
from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet

ROGUE = "import pathlib; pathlib.Path('/workspace/PWNED').write_text('rogue code ran')"


def bash(command: str, **extra: Any) -> dict[str, Any]:
    args = json.dumps({"command": command})
    return {"call_id": "c", "type": "function_call", "function": {"name": "bash", "arguments": args}, **extra}


def run(c: httpx.Client, sid: str, command: str, auto_resume: bool = True) -> str:
    r = c.post(f"/v1/environments/my-env/sessions/{sid}", json=bash(command, auto_resume=auto_resume))
    assert r.status_code == 200, r.text
    return str(r.json()["output"])


@pytest.fixture(scope="module", params=SANDBOX_LEVELS)
def level_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    """A fleet at one sandbox level (as `make run` starts it, the level named in the config)."""
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    cfg = base_config(tmp, free_port())
    cfg["local_substrate"] = {**cfg["local_substrate"], "sandbox": request.param, "slots": 4}
    fleet = start_fleet(tmp, cfg)
    fleet.level = request.param  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


def test_a_planted_guest_never_runs_and_the_session_keeps_working(level_fleet: RunningFleet) -> None:
    sid, bystander = f"h-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    with level_fleet.client() as c:
        # given a tenant that plants a `guest` package and startup hooks where the guest would look
        files = " ".join(f"{d}/{f}" for d in ("/workspace", "/tmp", "/var/lib/atefleet-guest")
                         for f in ("guest/__init__.py", "guest/__main__.py", "sitecustomize.py"))
        plant = "for d in /workspace /tmp /var/lib/atefleet-guest; do mkdir -p $d/guest; done; "
        plant += f"printf '%s\\n' {shlex.quote(ROGUE)} | tee {files} >/dev/null; echo ok"
        assert run(c, sid, plant) == "ok\n"
        # when the session is suspended (the workspace is kept) and the next call resumes it
        r = c.post(f"/v1/environments/my-env/sessions/{sid}/suspend")
        assert r.status_code == 200, r.text
        out = run(c, sid, "test -e /workspace/PWNED && echo PWNED; wc -l < guest/__main__.py")
        # then the real guest answered, the planted code never ran, the tenant's files are intact
        assert out == "1\n"
        # and another session still answers
        assert run(c, bystander, "echo alive") == "alive\n"


@pytest.mark.non_root
def test_no_fleet_secret_config_or_state_is_visible_inside(level_fleet: RunningFleet) -> None:
    key = base64.b64encode((level_fleet.state_dir / "secrets.key").read_bytes()).decode()
    with level_fleet.client() as c:
        seen = run(c, f"s-{uuid.uuid4().hex[:8]}", (
            "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done; env; ls -A /etc; "
            f"cat /etc/passwd; cat {level_fleet.config_path} {level_fleet.state_dir}/secrets.key 2>&1; "
            f"ls {level_fleet.state_dir} 2>&1"))
    assert key not in seen
    assert "redis://" not in seen
    # (a call's own session token is the one ATEFLEET_ variable a command is meant to see)
    assert not [w for w in seen.split() if w.startswith("ATEFLEET_") and "SESSION_TOKEN" not in w]
    assert "No such file or directory" in seen and "listen:" not in seen  # no config, no state dir
    assert "atefleet" not in seen.split()  # no /etc/atefleet


def test_the_fleets_loopback_services_are_unreachable(level_fleet: RunningFleet) -> None:
    port = int(level_fleet.url.rpartition(":")[2])
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    with level_fleet.client() as c:
        out = run(c, f"n-{uuid.uuid4().hex[:8]}", f'python3 -c "{code}" 2>&1 | tail -1')
    assert "CONNECTED" not in out and "refused" in out.lower()


@pytest.mark.non_root
def test_healthz_and_the_banner_state_the_isolation_in_force(level_fleet: RunningFleet) -> None:
    level = level_fleet.level  # type: ignore[attr-defined]
    health = httpx.get(f"{level_fleet.url}/healthz").json()
    isolation = health["isolation"]
    assert health["sandbox"] == isolation["sandbox"] == level
    assert isolation["per_slot_uids"] is (os.geteuid() == 0) and "/dev/shm" in isolation["memory"]
    assert f"isolation: sandbox {level}, per-slot uids" in level_fleet.log()


def test_network_host_is_refused_at_start_without_auth(short_tmp: Path) -> None:
    cfg = base_config(short_tmp, free_port())
    cfg["local_substrate"]["templates"] = [{"name": "default-env-template", "network": "host"}]
    with pytest.raises(RuntimeError, match="network: host"):
        start_fleet(short_tmp, cfg)


@pytest.mark.parametrize("sid", ["../x", "a b", "-lead", "x" * 129, "é", ".hidden"])
def test_a_batch_refuses_session_ids_no_other_route_accepts(fleet: RunningFleet, sid: str) -> None:
    with fleet.client() as c:
        calls = [{"environment": "my-env", "session": "fine-1", **bash("true")},
                 {"environment": "my-env", "session": sid, **bash("true")}]
        r = c.post("/v1/jobs:batch", json={"calls": calls})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["field"] == "calls.1.session"
        # the same id on the single-call route is refused the same way, and nothing was queued
        assert c.post(f"/v1/environments/my-env/sessions/{sid}", json=bash("true")).status_code in (404, 422)
        listed = c.get("/v1/environments/my-env/sessions").json()
        assert all(s.get("session") != sid and s.get("id") != sid for s in listed.get("sessions", []))
