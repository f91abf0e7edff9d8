"""`atefleet up` as an operator sees it: supervision, clean shutdown, state reuse, metrics, the CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet, wait_until


def _niceness(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # field 19, counted after the command name


def _restarted(fleet: RunningFleet, before: dict[str, int], role: str) -> bool:
    """The killed `role` process is gone and a new one took its place."""
    now = fleet.children()
    return before[role] not in now.values() and len(now) == len(before)


def _ready(fleet: RunningFleet) -> bool:
    try:
        return httpx.get(f"{fleet.url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _bash_call(c: httpx.Client, sid: str, command: str) -> httpx.Response:
    body = {
        "call_id": "c",
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    return c.post(f"/v1/environments/my-env/sessions/{sid}", json=body)


def _bash(c: httpx.Client, sid: str, command: str) -> dict[str, object]:
    r = _bash_call(c, sid, command)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.embedded_redis  # kills the embedded Redis and sees the supervisor restart it
def test_killed_children_are_restarted_and_ctrl_c_leaves_nothing(short_tmp: Path) -> None:
    # two API processes sharing the port (SO_REUSEPORT), as `api.processes: 2` asks
    fleet = start_fleet(short_tmp, base_config(short_tmp, free_port(), api={"processes": 2}))
    try:
        _supervision_and_clean_stop(fleet, short_tmp)
    finally:
        fleet.stop()


def _supervision_and_clean_stop(fleet: RunningFleet, tmp_path: Path) -> None:
    roles = fleet.children()
    expected = {"api-0", "api-1", "reconciler", "webhooks", "local-substrate", "worker-w0", "worker-w1"}
    assert expected <= set(roles)
    # workers run below the API and Redis (workers.nice, default 5); the rest as started
    up = _niceness(fleet.process.pid)
    assert {r: _niceness(pid) - up for r, pid in roles.items()} == {
        r: 5 if r.startswith("worker-") else 0 for r in roles}
    with fleet.client() as c:
        assert c.post("/v1/environments/my-env/sessions/keep/resume").status_code == 200
        _bash(c, "keep", "echo survived > kept.txt")
    # when any child is SIGKILLed, then it is noticed and restarted
    for role in ("worker-w0", "api-0", "reconciler"):
        os.kill(roles[role], signal.SIGKILL)
        wait_until(lambda r=role: _restarted(fleet, roles, r), f"{role} restart")
    wait_until(lambda: _ready(fleet), "api ready again")
    assert "restarting" in fleet.log()
    _redis_outage_is_a_503(fleet)
    # when Ctrl-C, then every process ends and no lock is left
    pids = set(fleet.children().values()) | {fleet.process.pid}
    fleet.process.send_signal(signal.SIGINT)
    fleet.process.wait(60)
    assert fleet.process.returncode == 0, fleet.log()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    # and the next start reuses the state dir: the session and its files are still there
    again = start_fleet(tmp_path, json.loads(json.dumps(_config_of(fleet))))
    try:
        with again.client() as c:
            assert c.post("/v1/environments/my-env/sessions/keep/resume").json()["cold_start"] is False
            assert _bash(c, "keep", "cat kept.txt")["output"] == "survived\n"
    finally:
        again.stop()


def _redis_outage_is_a_503(fleet: RunningFleet) -> None:
    """When the embedded Redis is SIGKILLed, callers get 503 problems with Retry-After (never a
    500 or a hang) until the supervisor has it back, and then calls work again."""
    port = (fleet.state_dir / "redis" / "port").read_text().strip()
    pid = int(subprocess.check_output(["pgrep", "-f", f"redis-server .*:{port}"]).split()[0])
    statuses: list[int] = []
    with fleet.client(timeout_s=60) as c:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = _bash_call(c, "keep", "echo up")
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.headers["content-type"] == "application/problem+json"
                assert r.headers["retry-after"] == "1" and r.json()["type"].endswith("/unavailable")
            elif r.status_code == 200 and r.json()["output"] == "up\n":
                break
            time.sleep(0.05)
        assert set(statuses) <= {200, 202, 503}, statuses
        assert statuses[-1] == 200, statuses
        for _ in range(3):
            assert _bash(c, "keep", "cat kept.txt")["output"] == "survived\n"


def _config_of(fleet: RunningFleet) -> dict[str, object]:
    import yaml

    return dict(yaml.safe_load(fleet.config_path.read_text()))


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_move_under_a_small_load(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        before = c.get("/metrics").text
        assert c.post("/v1/environments/my-env/sessions/metrics-1/resume").status_code == 200
        for _ in range(5):
            _bash(c, "metrics-1", "true")
        after = c.get("/metrics").text
    for name, labels in (
        ("atefleet_jobs_finished_total", {"kind": "tool", "state": "succeeded"}),
        ("atefleet_jobs_enqueued_total", {"kind": "tool"}),
        ("atefleet_guest_call_seconds_count", {"tool": "bash"}),
        ("atefleet_actor_op_seconds_count", {}),
    ):
        assert _metric(after, name, **labels) > _metric(before, name, **labels), name
    for name in (
        "atefleet_queue_depth",
        "atefleet_oldest_queued_job_age_seconds",
        "atefleet_sessions",
        "atefleet_lease_losses_total",
    ):
        assert re.search(rf"^# TYPE {name}", after, re.M), name


def test_cli_exec_sessions_and_jobs(fleet: RunningFleet) -> None:
    env = {**os.environ, "ATEFLEET_API_URL": fleet.url}
    cli = [sys.executable, "-m", "atefleet"]
    out = subprocess.run(
        [*cli, "exec", "my-env", "cli-1", "--", "echo from-cli; exit 3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout == "from-cli\n" and out.returncode == 3, out.stderr
    ls = subprocess.run(
        [*cli, "sessions", "ls", "my-env"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ls.returncode == 0 and "cli-1" in ls.stdout and "SESSION" in ls.stdout
    show = subprocess.run(
        [*cli, "sessions", "show", "my-env", "cli-1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "running" in show.stdout
    with httpx.Client(base_url=fleet.url) as c:
        body = {
            "call_id": "j",
            "type": "function_call",
            "function": {"name": "bash", "arguments": json.dumps({"command": "true"})},
        }
        job = c.post(
            "/v1/environments/my-env/sessions/cli-1", json=body, headers={"Prefer": "respond-async"}
        ).json()
    shown = subprocess.run(
        [*cli, "jobs", "show", job["id"], "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(shown.stdout)["id"] == job["id"]
    sus = subprocess.run(
        [*cli, "suspend", "my-env", "cli-1", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert sus.returncode == 0 and '"ok"' in sus.stdout
