"""Sessions beyond the slots whose parks left their files held in frozen sandboxes (no snapshot
written, local_substrate/control.py "Held files"), while the local Substrate is SIGKILLed: its
restart writes every held file, so each session's next call finds everything its earlier calls
wrote, in order; and calls go on."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import RunningFleet, few_slots_fleet, wait_until
from tests.substrate.conftest import FREEZES

SLOTS = 2
SESSIONS = 8
CALLS = 3


@pytest.fixture(scope="module")
def held_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    with few_slots_fleet(tmp_path_factory.mktemp("held-chaos"), SLOTS) as fleet:
        yield fleet


def _call(command: str) -> dict[str, Any]:
    return {"call_id": "c", "type": "function_call",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}


def _base(sid: str) -> str:
    return f"/v1/environments/my-env/sessions/{sid}"


def _append(c: httpx.Client, sid: str, n: int) -> str:
    r = c.post(_base(sid), json=_call(f"echo {n} >> counter; tr '\\n' ' ' < counter"))
    assert r.status_code == 200, r.text
    return str(r.json()["output"]).strip()


def test_a_killed_local_substrate_loses_no_held_file(held_fleet: RunningFleet) -> None:
    fleet = held_fleet
    sids = [f"hc-{uuid.uuid4().hex[:8]}-{i}" for i in range(SESSIONS)]

    def agent(sid: str, first: int) -> list[str]:
        with fleet.client() as c:
            return [_append(c, sid, n) for n in range(first, first + CALLS)]

    with fleet.client() as c:
        # given many more sessions than slots, each appending to its counter call after call
        for sid in sids:
            assert c.post(f"{_base(sid)}/resume").status_code == 200
        with ThreadPoolExecutor(SESSIONS) as pool:
            outs = list(pool.map(agent, sids, [0] * SESSIONS))
        assert all(o[-1] == "0 1 2" for o in outs), outs
        # and every one of them parked by the fleet (two more sessions take the slots)
        for extra in (f"hc-x-{uuid.uuid4().hex[:8]}" for _ in range(SLOTS)):
            assert c.post(f"{_base(extra)}/resume").status_code == 200
        views = [c.get(_base(sid)).json() for sid in sids]
        assert {v["suspended_by"] for v in views} == {"pressure"}
        if FREEZES:  # kept frozen, their files held: no snapshot of them was written
            assert {v["snapshot"]["bytes"] for v in views} == {None}

        # when the local Substrate is SIGKILLed (its frozen sandboxes die with it) and restarted
        before = fleet.children()["local-substrate"]
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: fleet.children().get("local-substrate", before) != before, "its restart", 60)

    # then every session's next calls find all it wrote, in order, and go on
    with ThreadPoolExecutor(SESSIONS) as pool:
        outs = list(pool.map(agent, sids, [CALLS] * SESSIONS))
    assert all(o == ["0 1 2 3", "0 1 2 3 4", "0 1 2 3 4 5"] for o in outs), outs
