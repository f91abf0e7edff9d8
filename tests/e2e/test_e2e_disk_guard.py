"""A tenant filling the host's disk between suspends, through the real path (API → queue → worker
→ local_substrate → sandbox) with `atefleet up`, at each sandbox level: while the disk is low
(a reserve larger than the disk's free space), the call that writes past the template's
`workspace_mb` answers 507 `workspace_over_quota` saying why, the session is suspended at its last
snapshot and its next call resumes from there, and a bystander within its quota keeps running."""

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

#: The template's workspace quota here (MB).
WORKSPACE_MB = 8
#: More than any disk has free: the guard measures running slots from its first check.
RESERVE_ALWAYS_LOW_MB = 1 << 30


@pytest.fixture(scope="module", params=SANDBOX_LEVELS)
def guarded_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    tmp = tmp_path_factory.mktemp(f"disk-guard-{request.param}")
    cfg = base_config(tmp, free_port())
    template = {**cfg["local_substrate"]["templates"][0], "limits": {"workspace_mb": WORKSPACE_MB}}
    cfg["local_substrate"] = {
        **cfg["local_substrate"], "sandbox": request.param, "templates": [template],
        "disk_reserve_mb": RESERVE_ALWAYS_LOW_MB, "disk_check_period_s": 0.2,
    }  # fmt: skip
    running = start_fleet(tmp, cfg)
    yield running
    running.stop()
    remove_tree(str(running.state_dir))


def _call(client: httpx.Client, base: str, command: str, auto_resume: bool = True) -> httpx.Response:
    body = {"call_id": "c", "type": "function_call", "auto_resume": auto_resume,
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}  # fmt: skip
    return client.post(base, json=body)


def _output(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()["output"]


def test_a_call_writing_past_the_quota_while_the_disk_is_low_gets_a_clear_error_and_the_session_resumes(
    guarded_fleet: RunningFleet,
) -> None:
    with guarded_fleet.client() as c:
        hog = f"/v1/environments/my-env/sessions/{uuid.uuid4()}"
        bystander = f"/v1/environments/my-env/sessions/{uuid.uuid4()}"
        # given a session whose last snapshot holds kept.txt (its client's suspend wrote it: the
        # fleet's park after an auto_resume call may only hold it, see the test below)
        assert _output(_call(c, hog, "echo kept > kept.txt && echo ok")) == "ok\n"
        assert c.post(f"{hog}/suspend").status_code == 200
        # and a bystander running within its quota
        assert c.post(f"{bystander}/resume").status_code == 200
        assert _output(_call(c, bystander, "head -c 2M /dev/urandom > mine && echo ok", False)) == "ok\n"
        # when a call writes past the template's workspace_mb
        r = _call(c, hog, "head -c 20M /dev/urandom > big && sleep 60")
        # then that call answers a 507 problem saying what happened
        assert r.status_code == 507, r.text
        problem = r.json()
        assert problem["type"].endswith("/workspace_over_quota")
        assert f"more than {WORKSPACE_MB} MB" in problem["detail"] and "last snapshot" in problem["detail"]
        assert c.get(hog).json()["state"] == "suspended"
        # and its next call resumes it at its last snapshot, intact
        assert _output(_call(c, hog, "cat kept.txt; test -e big || echo no-big")) == "kept\nno-big\n"
        # and the bystander, measured all along, still answers with its files
        assert _output(_call(c, bystander, "wc -c < mine", False)) == f"{2 << 20}\n"


def test_without_auto_resume_the_call_is_409_and_its_resume_says_why(guarded_fleet: RunningFleet) -> None:
    with guarded_fleet.client() as c:
        hog = f"/v1/environments/my-env/sessions/{uuid.uuid4()}"
        # given a resumed session whose last snapshot holds kept.txt (its client's suspend wrote
        # it; the fleet's park after an auto_resume call may leave it held in the frozen sandbox,
        # and the guard's stop drops held files with the rest: control.py, "Held files")
        assert _output(_call(c, hog, "echo kept > kept.txt && echo ok")) == "ok\n"
        assert c.post(f"{hog}/suspend").status_code == 200
        assert c.post(f"{hog}/resume").status_code == 200
        # when a call without auto_resume writes past the quota, then it answers as after any
        # actor death: the session is not running (it may not resume on its own)
        r = _call(c, hog, "head -c 20M /dev/urandom > big && sleep 60", auto_resume=False)
        assert r.status_code == 409 and r.json()["type"].endswith("/session_not_running"), r.text
        # and its resume answers the 507 saying why; the resume after it restores the snapshot
        r = c.post(f"{hog}/resume")
        assert r.status_code == 507 and r.json()["type"].endswith("/workspace_over_quota"), r.text
        assert c.post(f"{hog}/resume").status_code == 200
        assert _output(_call(c, hog, "cat kept.txt; test -e big || echo no-big", False)) == "kept\nno-big\n"
