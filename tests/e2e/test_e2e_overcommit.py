"""Many more sessions than Substrate slots, through the real fleet: pressure parking, wake on call,
who suspended a session, background processes after auto_resume, and GET /v1/capacity."""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import zstandard

from common.config import Config, load_config
from common.guest_client import REQUEST_SLACK_S
from common.queue.keys import Keys, session_name
from common.routing import substrate_address
from common.substrate import make_substrate_client
from tests.e2e.conftest import RunningFleet, few_slots_fleet

SLOTS = 3


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    """A fleet with few slots and the shipped capacity defaults (min_idle_s, capacity_wait_s)."""
    with few_slots_fleet(tmp_path_factory.mktemp("overcommit"), SLOTS) as fleet:
        yield fleet


def _call(name: str, call_id: str = "c1", **arguments: Any) -> dict[str, Any]:
    return {"call_id": call_id, "type": "function_call",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def _base(sid: str) -> str:
    return f"/v1/environments/my-env/sessions/{sid}"


def _view(c: httpx.Client, sid: str) -> dict[str, Any]:
    r = c.get(_base(sid))
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_resumes_past_the_slots_park_idle_sessions_and_calls_wake_them(small_fleet: RunningFleet) -> None:
    sids = [f"oc-{uuid.uuid4().hex[:8]}-{i}" for i in range(SLOTS * 2 + 1)]
    with small_fleet.client() as c:
        # given every session resumed one after another (more than there are slots), each writing a file
        for sid in sids:
            r = c.post(f"{_base(sid)}/resume")
            assert r.status_code == 200, r.text
            r = c.post(_base(sid), json=_call("write_file", path="mark.txt", content=f"first {sid}"))
            assert r.status_code == 200 and "error" not in r.json()["output"].lower(), r.text
        # then the earliest sessions were parked by pressure, not by their client
        parked = [sid for sid in sids if _view(c, sid)["state"] == "suspended"]
        assert len(parked) >= len(sids) - SLOTS
        assert {_view(c, sid)["suspended_by"] for sid in parked} == {"pressure"}
        # when each session gets calls again without auto_resume, then each wakes with its file intact
        for sid in sids:
            r = c.post(_base(sid), json=_call("read_file", path="mark.txt"))
            assert r.status_code == 200, r.text
            assert f"first {sid}" in r.json()["output"]
        # and capacity shows the slots, the parks, and nobody left waiting
        cap = c.get("/v1/capacity").json()
        assert cap["parks"]["per_minute"] >= len(sids)
        assert cap["sessions"]["waiting"] == 0 and cap["wait_queue"]["length"] == 0
        assert cap["sessions"]["running"] <= SLOTS


def test_concurrent_sessions_beyond_slots_keep_order_and_files(small_fleet: RunningFleet) -> None:
    # given many sessions at once on few slots, each appending to a counter file call after call
    sids = [f"cc-{uuid.uuid4().hex[:8]}-{i}" for i in range(SLOTS * 4)]

    def agent(sid: str) -> list[str]:
        with small_fleet.client() as c:
            assert c.post(f"{_base(sid)}/resume").status_code == 200
            outs = []
            for n in range(4):
                command = f"echo {n} >> counter; tr '\\n' ' ' < counter"
                r = c.post(_base(sid), json=_call("bash", command=command))
                assert r.status_code == 200, r.text
                outs.append(r.json()["output"].strip())
            return outs

    with ThreadPoolExecutor(len(sids)) as pool:
        results = list(pool.map(agent, sids))
    # then every session saw its own counter grow one line per call, none lost across parks
    for outs in results:
        assert outs == ["0", "0 1", "0 1 2", "0 1 2 3"]


def test_client_suspend_answers_409_and_fleet_parks_wake(small_fleet: RunningFleet) -> None:
    sid = f"cs-{uuid.uuid4().hex[:8]}"
    with small_fleet.client() as c:
        assert c.post(f"{_base(sid)}/resume").status_code == 200
        # when its client suspends it, then a call without auto_resume is refused as before
        assert c.post(f"{_base(sid)}/suspend").status_code == 200
        assert _view(c, sid)["suspended_by"] == "client"
        r = c.post(_base(sid), json=_call("bash", command="true"))
        assert r.status_code == 409 and r.json()["type"].endswith("session_not_running"), r.text
        # when a call with auto_resume runs, then the fleet parks it after, and the next plain call wakes it
        r = c.post(_base(sid), json={**_call("bash", command="echo hi > f"), "auto_resume": True})
        assert r.status_code == 200, r.text
        assert _view(c, sid)["suspended_by"] == "auto_resume"
        r = c.post(_base(sid), json=_call("read_file", path="f"))
        assert r.status_code == 200 and r.json()["output"].strip() == "hi", r.text
        assert _view(c, sid)["state"] == "running"


def test_background_process_of_an_auto_resume_call_survives_it(small_fleet: RunningFleet) -> None:
    sid = f"bg-{uuid.uuid4().hex[:8]}"
    with small_fleet.client() as c:
        # when an auto_resume call starts a background process
        call = _call("bash", command="sleep 60", background=True)
        r = c.post(_base(sid), json={**call, "auto_resume": True})
        assert r.status_code == 200, r.text
        # then the session stays running with the process tracked, and the next call sees it alive
        view = _view(c, sid)
        assert view["state"] == "running" and len(view["background_processes"]) == 1
        r = c.post(_base(sid), json={**_call("bash", command="pgrep -c sleep"), "auto_resume": True})
        assert r.status_code == 200 and r.json()["output"].strip() == "1", r.text
        assert _view(c, sid)["state"] == "running"
        # (clean up: a forced suspend frees the slot for the other tests)
        assert c.post(f"{_base(sid)}/suspend", params={"force": "true"}).status_code == 200


def test_pressure_parks_others_not_a_session_running_a_background_process(small_fleet: RunningFleet) -> None:
    keeper = f"bgk-{uuid.uuid4().hex[:8]}"
    others = [f"bgo-{uuid.uuid4().hex[:8]}-{i}" for i in range(SLOTS * 2)]
    with small_fleet.client() as c:
        # given a session that started a background process with a plain call (no auto_resume)
        assert c.post(f"{_base(keeper)}/resume").status_code == 200
        r = c.post(_base(keeper), json=_call("bash", command="sleep 60", background=True))
        assert r.status_code == 200, r.text
        # when more sessions than the other slots resume and call, one after another
        for sid in others:
            assert c.post(f"{_base(sid)}/resume").status_code == 200
            r = c.post(_base(sid), json=_call("write_file", path="m.txt", content=sid))
            assert r.status_code == 200, r.text
        # then pressure parked the others, never the session whose process runs, and it still runs
        assert {_view(c, sid)["suspended_by"] for sid in others[:-SLOTS]} == {"pressure"}
        view = _view(c, keeper)
        assert view["state"] == "running" and len(view["background_processes"]) == 1
        r = c.post(_base(keeper), json=_call("bash", command="pgrep -c sleep"))
        assert r.status_code == 200 and r.json()["output"].strip() == "1", r.text
        # (clean up: a forced suspend frees the slot for the other tests)
        assert c.post(f"{_base(keeper)}/suspend", params={"force": "true"}).status_code == 200


def test_capacity_shape(small_fleet: RunningFleet) -> None:
    with small_fleet.client() as c:
        r = c.get("/v1/capacity")
    assert r.status_code == 200, r.text
    cap = r.json()
    assert set(cap) >= {"workers", "sessions", "wait_queue", "parks", "min_idle_s", "capacity_wait_s"}
    assert set(cap["workers"]) == {"total", "busy", "free", "observed_at_ms"}
    assert set(cap["sessions"]) == {"running", "parked", "waiting"}
    assert cap["workers"]["total"] in (None, SLOTS)


def test_a_parked_session_whose_actor_vanished_wakes_on_a_new_one(small_fleet: RunningFleet) -> None:
    # A wake of a session the fleet parked resumes without reading the actor first; one deleted
    # behind the fleet's back meanwhile must still wake, from a new actor (its files are gone).
    sid = f"oc-gone-{uuid.uuid4().hex[:8]}"
    with small_fleet.client() as c:
        assert c.post(f"{_base(sid)}/resume").status_code == 200
        assert c.post(_base(sid), json=_call("write_file", path="f.txt", content="x")).status_code == 200
        r = c.post(f"{_base(sid)}/suspend")
        assert r.status_code == 200, r.text
        # given the session parked by the fleet (as the reconciler's idle pass records it), and
        # its actor deleted directly in Substrate
        config = load_config(small_fleet.config_path)
        small_fleet.redis_client().hset(Keys(config.redis_prefix).session(session_name("my-env", sid)),
                                        "suspended_by", "idle")
        asyncio.run(_delete_actor(config, _view(c, sid)["actor"]))  # {"name", "atespace"}
        # when a call comes without auto_resume, then the session wakes on a new actor
        r = c.post(_base(sid), json=_call("bash", command="ls f.txt; echo up"))
        assert r.status_code == 200, r.text
        assert "up" in r.json()["output"] and "No such file" in r.json()["output"]
        assert _view(c, sid)["state"] == "running"


def test_a_fleet_park_holds_the_files_and_a_clients_suspend_or_destroy_writes_them(
    small_fleet: RunningFleet,
) -> None:
    sid = f"hd-{uuid.uuid4().hex[:8]}"
    config = load_config(small_fleet.config_path)
    with small_fleet.client() as c:
        # given a session the fleet parked after an auto_resume call: its sandbox is kept frozen
        # with the file, and no snapshot was written for it
        r = c.post(_base(sid), json={**_call("bash", command="echo kept > f"), "auto_resume": True})
        assert r.status_code == 200, r.text
        view = _view(c, sid)
        assert view["suspended_by"] == "auto_resume"
        assert asyncio.run(_latest_snapshot(config, view["actor"])) == ""

        # when its client suspends it, then the file is written in a snapshot
        assert c.post(f"{_base(sid)}/suspend").status_code == 200
        view = _view(c, sid)
        assert view["suspended_by"] == "client" and view["snapshot"]["bytes"]
        written = asyncio.run(_latest_snapshot(config, view["actor"]))
        assert written and os.path.exists(written)

        # and a destroy that keeps the snapshot names the one holding its latest files
        r = c.post(_base(sid), json={**_call("bash", command="echo later >> f"), "auto_resume": True})
        assert r.status_code == 200, r.text
        r = c.delete(_base(sid), params={"keep_snapshot": "true"})
        assert r.status_code in (200, 202), r.text
        deadline = time.monotonic() + 30
        while (view := _view(c, sid))["state"] != "destroyed":
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        kept = view["snapshot"]["location"]
        assert kept and kept != written and os.path.exists(kept)
        assert _snapshot_file(kept, "workspace/f") == b"kept\nlater\n"


async def _latest_snapshot(config: Config, actor: dict[str, str]) -> str:
    async with make_substrate_client(config, substrate_address(config)) as substrate:
        return (await substrate.get_actor(actor["atespace"], actor["name"])).latest_snapshot


def _snapshot_file(path: str, member: str) -> bytes:
    with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as zr:
        with tarfile.open(fileobj=zr, mode="r|") as tar:
            for info in tar:
                if info.name == member:
                    data = tar.extractfile(info)
                    assert data is not None
                    return data.read()
    raise AssertionError(f"{member} is not in {path}")


async def _delete_actor(config: Config, actor: dict[str, str]) -> None:
    async with make_substrate_client(config, substrate_address(config)) as substrate:
        await substrate.delete_actor(actor["atespace"], actor["name"])


@dataclass
class _Pressure:
    """Every slot but one held by a session running a background process (no park candidate),
    the last by `busy`, whose long call runs (leased: no candidate either), and `waiting`'s
    resume waiting for a worker."""

    keepers: list[str]
    busy: str
    waiting: str
    long_call: Future[httpx.Response]
    resumed: Future[httpx.Response]


@contextmanager
def _pressure(c: httpx.Client, pool: ThreadPoolExecutor) -> Iterator[_Pressure]:
    keepers = [f"ek-{uuid.uuid4().hex[:8]}-{i}" for i in range(SLOTS - 1)]
    busy, waiting = f"eb-{uuid.uuid4().hex[:8]}", f"ew-{uuid.uuid4().hex[:8]}"
    for sid in keepers:
        call = _call("bash", command="sleep 60", background=True)
        r = c.post(_base(sid), json={**call, "auto_resume": True})
        assert r.status_code == 200 and _view(c, sid)["state"] == "running", r.text
    assert c.post(f"{_base(busy)}/resume").status_code == 200
    long_call = pool.submit(c.post, _base(busy), json=_call(
        "bash", command="sleep 2; echo done > f.txt; echo done"))
    _wait_state(c, busy, lambda v: v["running_job"] is not None)
    resumed = pool.submit(c.post, f"{_base(waiting)}/resume")
    _wait_state(c, waiting, lambda v: v["capacity_wait"] is not None)
    yield _Pressure(keepers, busy, waiting, long_call, resumed)
    # (clean up: forced suspends free the slots for the other tests)
    for sid in (*keepers, busy, waiting):
        assert c.post(f"{_base(sid)}/suspend", params={"force": "true"}).status_code == 200


def _park_results(fleet: RunningFleet, sid: str) -> list[bytes]:
    """The stored records of the fleet's jobs that name `sid` (a finished one keeps its result)."""
    keys, redis = Keys(load_config(fleet.config_path).redis_prefix), fleet.redis_client()
    records = (b"".join(redis.hgetall(k).values()) for k in redis.scan_iter(match=keys.job("*"), count=1000))
    return [r for r in records if sid.encode() in r and (b'"parked"' in r or b'"skipped"' in r)]


def test_a_call_ending_while_a_resume_waits_parks_its_own_session(small_fleet: RunningFleet) -> None:
    with small_fleet.client() as c, ThreadPoolExecutor(2) as pool, _pressure(c, pool) as p:
        # when the long call ends
        r = p.long_call.result(30)
        assert r.status_code == 200 and r.json()["output"] == "done\n", r.text
        # then the waiting resume gets the worker: the call's own session was parked right after it
        r = p.resumed.result(30)
        assert r.status_code == 200, r.text
        assert _view(c, p.busy)["suspended_by"] == "pressure"
        assert any(b'"at_end":true' in j for j in _park_results(small_fleet, p.busy))
        # and its next call wakes it with its file
        r = c.post(_base(p.busy), json=_call("read_file", path="f.txt"))
        assert r.status_code == 200 and r.json()["output"].strip() == "done", r.text


@pytest.fixture(scope="module")
def patient_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    """Few slots, and sessions kept up a second after a call while resumes wait (min_idle_s)."""
    with few_slots_fleet(tmp_path_factory.mktemp("overcommit-patient"), SLOTS, {"min_idle_s": 1.0}) as fleet:
        yield fleet


def test_with_min_idle_a_back_to_back_call_keeps_its_session_up(patient_fleet: RunningFleet) -> None:
    with patient_fleet.client() as c, ThreadPoolExecutor(2) as pool, _pressure(c, pool) as p:
        # when the long call ends, and its session's next call follows at once
        r = p.long_call.result(30)
        assert r.status_code == 200, r.text
        r = c.post(_base(p.busy), json=_call("read_file", path="f.txt"))
        # then that call ran on the session still up: the park after the first call waited out
        # min_idle_s, found it queued, and stood down
        assert r.status_code == 200 and r.json()["output"].strip() == "done", r.text
        assert any(b"more work is queued" in j for j in _park_results(patient_fleet, p.busy))
        # and the park after the second call, once min_idle_s passed, gave the waiter its worker
        r = p.resumed.result(30)
        assert r.status_code == 200, r.text
        assert _view(c, p.busy)["suspended_by"] == "pressure"


def _wait_state(c: httpx.Client, sid: str, ok: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = c.get(_base(sid))
        if r.status_code == 200 and ok(r.json()):
            return
        time.sleep(0.02)
    raise AssertionError(f"session {sid} did not reach the state wanted: {c.get(_base(sid)).text}")


def test_with_two_worker_processes_no_call_goes_to_a_guest_the_other_parked(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # A worker uses the guest it used in the session's lease just before without asking
    # Substrate: no other worker held the session since. A session the other process parked in
    # between has a frozen sandbox, whose socket takes a call and never answers it: that call
    # would wait out the guest client's request slack, then wake the session.
    tmp = tmp_path_factory.mktemp("overcommit-two-workers")
    with few_slots_fleet(tmp, 1, {"processes": 2}) as fleet, fleet.client() as c:
        sids = [f"tw-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]
        for sid in sids:
            assert c.post(f"{_base(sid)}/resume").status_code == 200
        # when two sessions take turns on one slot, each call parking the other (whichever
        # process runs which)
        for i in range(12):
            for sid in sids:
                began = time.monotonic()
                r = c.post(_base(sid), json=_call("bash", command=f"echo {i} >> n; tail -1 n"))
                took_s = time.monotonic() - began
                # then every call runs, in order, and none waited on a frozen guest
                assert r.status_code == 200 and r.json()["output"] == f"{i}\n", r.text
                assert took_s < REQUEST_SLACK_S, f"call {i} of {sid} took {took_s:.1f} s"
        # and the one slot went back and forth by pressure parks
        assert [_view(c, sid)["suspended_by"] for sid in sids] == ["pressure", None]
