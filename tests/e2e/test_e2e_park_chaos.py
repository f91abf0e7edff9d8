"""Sessions beyond the slots while the worker is SIGKILLed with a pressure park in flight: no
file lost, every session still answers, and no slot stays held."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from common.config import load_config
from common.queue.keys import Keys
from tests.e2e.conftest import RunningFleet, few_slots_fleet, wait_until

SLOTS = 2
#: Suspends take this long (fault injection), so the test can kill the worker mid-park.
SUSPEND_MS = 2000


@pytest.fixture(scope="module")
def slow_park_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    faults = {"latency_ms": {"SuspendActor": SUSPEND_MS}}
    with few_slots_fleet(tmp_path_factory.mktemp("park-chaos"), SLOTS, faults=faults) as fleet:
        yield fleet


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": "c", "type": "function_call",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _base(sid: str) -> str:
    return f"/v1/environments/my-env/sessions/{sid}"


def _resume(fleet: RunningFleet, sid: str) -> httpx.Response:
    with fleet.client() as c:
        return c.post(f"{_base(sid)}/resume")


def test_worker_killed_mid_park_loses_nothing_and_holds_no_slot(slow_park_fleet: RunningFleet) -> None:
    fleet = slow_park_fleet
    sids = [f"pk-{uuid.uuid4().hex[:8]}-{i}" for i in range(SLOTS + 1)]
    with fleet.client() as c:
        # given every slot taken by a session that wrote a file
        for sid in sids[:SLOTS]:
            assert c.post(f"{_base(sid)}/resume").status_code == 200
            r = c.post(_base(sid), json=_call("write_file", path="keep.txt", content=sid))
            assert r.status_code == 200, r.text

        # when one more session resumes, a pressure park starts (once one of them has been idle for
        # workers.min_idle_s), and the worker is SIGKILLed mid-park
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(_resume, fleet, sids[-1])

            def parking() -> bool:
                return any(c.get(_base(s)).json()["state"] == "suspending" for s in sids[:SLOTS])

            wait_until(parking, "a pressure park in flight")
            workers = [pid for role, pid in fleet.children().items() if role.startswith("worker-")]
            assert workers, "no worker process found"
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            # then the resume that asked for the park still gets its slot (after the worker's restart)
            r = late.result(timeout=120)
        assert r.status_code == 200, r.text
        # and every session answers its next call with its file, the parked one woken by the call
        for sid in sids[:SLOTS]:
            r = c.post(_base(sid), json=_call("read_file", path="keep.txt"))
            assert r.status_code == 200 and sid in r.json()["output"], r.text
        # and once the client suspends them all, no slot is held
        for sid in sids:
            assert c.post(f"{_base(sid)}/suspend").status_code == 200

        def no_slot_held() -> bool:
            return c.get("/v1/capacity").json()["workers"]["busy"] == 0

        wait_until(no_slot_held, "every slot to be free")
        assert {c.get(_base(s)).json()["suspended_by"] for s in sids} == {"client"}


def test_killed_worker_restarts(slow_park_fleet: RunningFleet) -> None:
    # (after the kill above) the fleet still takes calls: the supervisor restarted the worker
    with slow_park_fleet.client() as c:
        sid = f"pk-{uuid.uuid4().hex[:8]}"
        r = c.post(_base(sid), json={**_call("bash", command="echo ok"), "auto_resume": True})
        assert r.status_code == 200 and r.json()["output"].strip() == "ok", r.text


def test_two_worker_processes_one_killed_midway_keep_every_sessions_order_and_files(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # Freed workers go to the first waiter in line in whichever worker process it waits (told
    # through Redis): the line must keep moving when a process dies with waiters told.
    slots, sessions, calls = 3, 12, 6
    done = threading.Semaphore(0)
    with few_slots_fleet(tmp_path_factory.mktemp("park-chaos-two"), slots, {"processes": 2}) as fleet:
        def agent(sid: str) -> list[str]:
            with fleet.client() as c:
                assert c.post(f"{_base(sid)}/resume").status_code == 200
                outs = []
                for n in range(calls):
                    command = f"echo {n} >> counter; tr '\\n' ' ' < counter"
                    r = c.post(_base(sid), json=_call("bash", command=command))
                    assert r.status_code == 200, r.text
                    outs.append(r.json()["output"].strip())
                    done.release()
                return outs

        # given many more sessions than slots at once, each appending to a counter call after call
        with ThreadPoolExecutor(sessions) as pool:
            results = [pool.submit(agent, f"pc-{uuid.uuid4().hex[:8]}-{i}") for i in range(sessions)]
            # when a third of the calls are done, one of the two worker processes is SIGKILLed
            for _ in range(sessions * calls // 3):
                assert done.acquire(timeout=120), "the calls stalled before the kill"
            workers = sorted(pid for role, pid in fleet.children().items() if role.startswith("worker-"))
            assert len(workers) == 2, workers
            os.kill(workers[0], signal.SIGKILL)
            outs = [r.result(timeout=300) for r in results]
        # then every session saw its own counter grow one line per call: none lost, none twice
        expected = [" ".join(str(i) for i in range(n + 1)) for n in range(calls)]
        assert all(o == expected for o in outs), outs
        # and nobody is left waiting for a worker, or marked told
        with fleet.client() as c:
            wait_until(lambda: c.get("/v1/capacity").json()["sessions"]["waiting"] == 0, "the line to empty")
        keys = Keys(load_config(fleet.config_path).redis_prefix)
        assert fleet.redis_client().zcard(keys.capacity_told) == 0
