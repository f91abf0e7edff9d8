"""Long sync calls through the real fleet with the shipped `jobs.sync_wait_s` (0): a seed-shaped
call waits for its tool; `Prefer: wait=N` (RFC 7240) or `respond-async` asks for a 202 instead."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet

#: Longer than the wait a test asks for, short enough for a test.
TOOL_S = 3


@pytest.fixture(scope="module")
def default_wait_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    tmp = tmp_path_factory.mktemp("long-calls")
    cfg = base_config(tmp, free_port())
    del cfg["jobs"]  # the shipped sync wait: as long as the job may take
    cfg["local_substrate"]["slots"] = 2
    running = start_fleet(tmp, cfg)
    yield running
    running.stop()


def _sleep_call(seconds: float, **arguments: Any) -> dict[str, Any]:
    return {"call_id": "c1", "type": "function_call", "auto_resume": True,
            "function": {"name": "bash", "arguments": json.dumps({"command": f"sleep {seconds}; echo done",
                                                                   **arguments})}}


def test_seed_shaped_call_waits_for_its_tool(default_wait_fleet: RunningFleet) -> None:
    sid = f"lc-{uuid.uuid4().hex[:8]}"
    with default_wait_fleet.client() as c:
        began = time.monotonic()
        r = c.post(f"/v1/environments/my-env/sessions/{sid}", json=_sleep_call(TOOL_S))
    # then the answer is the tool's, however long it ran (no 202 to a client that cannot follow one)
    assert r.status_code == 200, r.text
    assert r.json()["output"].strip() == "done"
    assert time.monotonic() - began >= TOOL_S


@pytest.mark.parametrize("prefer", ["wait=1", "respond-async", "handling=lenient, wait=1"])
def test_prefer_asks_for_a_202(default_wait_fleet: RunningFleet, prefer: str) -> None:
    sid = f"lp-{uuid.uuid4().hex[:8]}"
    with default_wait_fleet.client() as c:
        r = c.post(f"/v1/environments/my-env/sessions/{sid}", json=_sleep_call(TOOL_S),
                   headers={"Prefer": prefer})
        # then a 202 with the job's location comes back before the tool is done
        assert r.status_code == 202, r.text
        location = r.headers["location"]
        assert r.headers["preference-applied"] == "respond-async"
        # and the job still finishes with the tool's answer
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job = c.get(location, params={"wait": 10}).json()
            if job["state"] == "succeeded":
                break
        assert job["state"] == "succeeded" and job["result"]["output"].strip() == "done"


@pytest.mark.parametrize("prefer", ["wait=", "wait=-1", "wait=soon", "wait=1e9"])
def test_a_malformed_wait_preference_is_ignored(default_wait_fleet: RunningFleet, prefer: str) -> None:
    # given a wait preference that is not delta-seconds, then it is ignored (RFC 7240: a server
    # ignores preferences it does not understand) and the call waits for its tool
    sid = f"lm-{uuid.uuid4().hex[:8]}"
    with default_wait_fleet.client() as c:
        r = c.post(f"/v1/environments/my-env/sessions/{sid}", json=_sleep_call(1), headers={"Prefer": prefer})
    assert r.status_code == 200, r.text
    assert r.json()["output"].strip() == "done"
