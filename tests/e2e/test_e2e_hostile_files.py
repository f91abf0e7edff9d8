"""A tenant attacking its own files and the host's disk, through the real path (API → queue →
worker → local_substrate → sandbox) with `atefleet up`, at each sandbox level: after each attack
the session still suspends and resumes with its other files (or its suspend is refused with a
clear problem and it is back at its last snapshot), and a bystander session still answers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from local_substrate.trees import remove_tree
from tests.conftest import SANDBOX_LEVELS
from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet
from tests.substrate.test_substrate_hostile_files import MAKE_DEEP, READ_DEEP

#: The template's limits here: small enough for a test to go past them.
LIMITS = {"tmp_mb": 16, "workspace_entries": 20_000}
#: A bystander's call must come back within this (s): the fleet is not stalled by the attack.
BYSTANDER_TIMEOUT_S = 30


@pytest.fixture(scope="module", params=SANDBOX_LEVELS)
def hostile_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    cfg = base_config(tmp, free_port())
    template = {**cfg["local_substrate"]["templates"][0], "limits": LIMITS}
    # The disk guard off: on a host with less than its reserve free it would stop the flood below
    # before its suspend is refused (tests/e2e/test_e2e_disk_guard.py covers the guard).
    cfg["local_substrate"] = {**cfg["local_substrate"], "sandbox": request.param, "templates": [template],
                              "disk_reserve_mb": 0}
    running = start_fleet(tmp, cfg)
    yield running
    running.stop()
    # Slot dirs may still hold what the attacks left: trees shutil.rmtree cannot delete.
    remove_tree(str(running.state_dir))


def _bash(command: str) -> dict[str, Any]:
    return {"call_id": "c", "type": "function_call",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}  # fmt: skip


class Session:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.base = f"/v1/environments/my-env/sessions/{uuid.uuid4()}"

    def run(self, command: str) -> str:
        r = self.client.post(self.base, json=_bash(command))
        assert r.status_code == 200, r.text
        return str(r.json()["output"])

    def resume(self) -> None:
        r = self.client.post(f"{self.base}/resume")
        assert r.status_code == 200, r.text

    def suspend(self) -> httpx.Response:
        return self.client.post(f"{self.base}/suspend")


@pytest.fixture
def attacked(hostile_fleet: RunningFleet) -> Iterator[Session]:
    """A resumed session holding kept.txt; after the attack, a bystander session still answers."""
    with hostile_fleet.client() as c:
        s = Session(c)
        s.resume()
        s.run("echo kept > kept.txt")
        yield s
        c.delete(s.base)
    with hostile_fleet.client(timeout_s=BYSTANDER_TIMEOUT_S) as c:
        bystander = Session(c)
        r = c.post(bystander.base, json={**_bash("echo alive"), "auto_resume": True})
        assert r.status_code == 200 and r.json()["output"] == "alive\n", r.text


def test_special_files_are_left_out_reported_and_the_rest_kept(attacked: Session) -> None:
    # given FIFOs, a unix socket and a device node attempted in the workspace
    out = attacked.run(
        "mkfifo pipe && mkdir sub && mkfifo sub/pipe2 && "
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && "
        "(mknod null c 1 3 2>/dev/null && echo MKNOD-WORKED || echo mknod refused)"
    )
    assert out == "mknod refused\n"
    # when suspended, then the answer reports what could not be kept
    r = attacked.suspend()
    assert r.status_code == 200, r.text
    dropped = r.json()["dropped_files"]
    assert dropped["count"] == 3
    assert sorted(dropped["paths"]) == ["workspace/pipe", "workspace/sock", "workspace/sub/pipe2"]
    # and the session resumes with its other files
    attacked.resume()
    assert attacked.run("cat kept.txt; ls sub; test -e pipe || echo no pipe") == "kept\nno pipe\n"


def test_deep_unreadable_sparse_and_many_files_survive(attacked: Session) -> None:
    # given a 2,000-level tree, mode-000 dirs and files, a sparse 900 MB file and 10,000 files
    attacked.run(" && ".join((
        MAKE_DEEP.format(n=2000),
        "mkdir locked && echo inside > locked/f && chmod 000 locked && echo s > closed && chmod 000 closed",
        "truncate -s 900M sparse",
        "mkdir many && cd many && seq 1 10000 | xargs touch",
    )))  # fmt: skip
    # when suspended and resumed, then everything is back
    r = attacked.suspend()
    assert r.status_code == 200, r.text
    assert "dropped_files" not in r.json()
    attacked.resume()
    out = attacked.run(" && ".join((
        READ_DEEP.format(n=2000),
        "stat -c %a locked closed | tr '\\n' ' ' && stat -c %s sparse && ls many | wc -l && cat kept.txt",
    )))  # fmt: skip
    assert out == f"deep\n0 0 {900 << 20}\n10000\nkept\n"


def test_a_workspace_over_its_limits_is_refused_with_a_clear_problem(attacked: Session) -> None:
    attacked.suspend()
    attacked.resume()
    # given more files than the template allows
    attacked.run("mkdir flood && cd flood && seq 1 25000 | xargs touch")
    # when suspended, then the answer is a 507 problem saying why, and the session is suspended
    r = attacked.suspend()
    assert r.status_code == 507, r.text
    problem = r.json()
    assert problem["type"].endswith("/snapshot_refused")
    assert "more than 20000 files" in problem["detail"] and "last snapshot" in problem["detail"]
    assert attacked.client.get(attacked.base).json()["state"] == "suspended"
    # and it resumes at its last snapshot: the flood is gone, the rest is there
    attacked.resume()
    assert attacked.run("ls") == "kept.txt\n"


def test_filling_tmp_fails_inside_the_sandbox_only(attacked: Session) -> None:
    # when /tmp is filled past the template's tmp_mb, then the write fails with ENOSPC
    out = attacked.run("head -c 64M /dev/zero 2>&1 >/tmp/fill; echo rc=$?")
    assert "No space left on device" in out and out.endswith("rc=1\n")
    # and the session still suspends and resumes with its files
    assert attacked.suspend().status_code == 200
    attacked.resume()
    assert attacked.run("cat kept.txt") == "kept\n"


def test_a_destroyed_sessions_snapshots_are_deleted(hostile_fleet: RunningFleet) -> None:
    snapshots = hostile_fleet.state_dir / "local-substrate" / "snapshots"
    with hostile_fleet.client() as c:
        s = Session(c)
        s.resume()
        s.run("echo kept > kept.txt")
        assert s.suspend().status_code == 200
        before = {p.name for p in snapshots.iterdir()}
        assert c.delete(s.base).status_code == 200
    assert len(before - {p.name for p in snapshots.iterdir()}) == 1
