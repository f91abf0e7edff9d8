"""Async jobs over real HTTP: 202 + polling, long-poll, SSE with resume, batch, cancel, idempotency."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.e2e.conftest import RunningFleet

ASYNC = {"Prefer": "respond-async"}


def bash(command: str, call_id: str = "c", **extra: Any) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        **extra,
    }


def read_log() -> dict[str, Any]:
    return {
        "call_id": "r",
        "type": "function_call",
        "function": {"name": "read_file", "arguments": json.dumps({"path": "log.txt"})},
    }


def resume(c: httpx.Client, sid: str) -> str:
    base = f"/v1/environments/my-env/sessions/{sid}"
    assert c.post(f"{base}/resume").status_code == 200
    return base


def wait_done(c: httpx.Client, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
    raise AssertionError(f"job {job_id} did not finish")


def test_202_location_and_job_json(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"a-{uuid.uuid4()}")
        r = c.post(base, json=bash("echo hi"), headers=ASYNC)
        assert r.status_code == 202
        job = r.json()
        assert r.headers["location"] == f"/v1/jobs/{job['id']}"
        for key in (
            "id",
            "state",
            "environment",
            "session",
            "created_at",
            "started_at",
            "finished_at",
            "result",
            "error",
        ):
            assert key in job
        done = wait_done(c, job["id"])
        assert done["state"] == "succeeded" and done["result"]["output"] == "hi\n"
        assert done["result"]["type"] == "function_call_output"


def test_100_async_calls_on_one_session_keep_submission_order(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"order-{uuid.uuid4()}")
        ids = [
            c.post(base, json=bash(f"echo {i} >> log.txt"), headers=ASYNC).json()["id"] for i in range(100)
        ]
        assert all(wait_done(c, i)["state"] == "succeeded" for i in ids)
        lines = c.post(base, json=read_log()).json()["output"].split()
    assert lines == [str(i) for i in range(100)]


def test_50_sessions_x_20_async_calls_each_keep_their_order(fleet: RunningFleet) -> None:
    def run(sid: str) -> list[str]:
        with fleet.client() as c:
            base = resume(c, sid)
            ids = [
                c.post(base, json=bash(f"echo {i} >> log.txt"), headers=ASYNC).json()["id"] for i in range(20)
            ]
            assert all(wait_done(c, i)["state"] == "succeeded" for i in ids)
            out = c.post(base, json=read_log()).json()["output"].split()
            c.post(f"{base}/suspend")
            return list(out)

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(run, [f"p-{uuid.uuid4()}" for _ in range(50)]))
    assert all(r == [str(i) for i in range(20)] for r in results)


def test_long_poll_returns_when_the_job_ends(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"lp-{uuid.uuid4()}")
        job = c.post(base, json=bash("sleep 1"), headers=ASYNC).json()
        started = time.monotonic()
        done = c.get(f"/v1/jobs/{job['id']}", params={"wait": 30}).json()
        took = time.monotonic() - started
    assert done["state"] == "succeeded"
    assert took < 10, took  # far below the 30 s wait: it returned when the job ended


def _sse(
    c: httpx.Client, job_id: str, last_id: str | None = None, stop_after: int | None = None
) -> list[tuple[str | None, str, dict[str, Any], float]]:
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events: list[tuple[str | None, str, dict[str, Any], float]] = []
    with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=60) as r:
        assert r.status_code == 200
        eid, event, data = None, "message", ""
        for line in r.iter_lines():
            if line.startswith("id:"):
                eid = line[3:].strip()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif not line and data:
                events.append((eid, event, json.loads(data), time.monotonic()))
                eid, event, data = None, "message", ""
                if stop_after is not None and len(events) >= stop_after:
                    break
    return events


def test_sse_streams_output_as_it_happens_and_resumes_without_loss(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"sse-{uuid.uuid4()}")
        job = c.post(base, json=bash("for i in 1 2 3; do echo tick$i; sleep 1; done"), headers=ASYNC).json()
        first = _sse(c, job["id"], stop_after=1)
        assert first[0][1] == "output"
        rest = _sse(c, job["id"], last_id=first[0][0])
    events = first + rest
    outputs = "".join(e[2]["data"] for e in events if e[1] == "output")
    assert outputs == "tick1\ntick2\ntick3\n"  # no loss, no duplication across the reconnect
    assert events[-1][1] == "result" and events[-1][2]["state"] == "succeeded"
    # chunks came as they happened: the first and the last output are ~2 s apart
    times = [e[3] for e in events if e[1] == "output"]
    assert times[-1] - times[0] > 1.0


def test_batch_keeps_array_order_per_session(fleet: RunningFleet) -> None:
    sids = [f"b-{uuid.uuid4()}" for _ in range(3)]
    with fleet.client() as c:
        for sid in sids:
            resume(c, sid)
        calls = [
            {"environment": "my-env", "session": sids[i % 3], **bash(f"echo {i} >> log.txt")}
            for i in range(30)
        ]
        r = c.post("/v1/jobs:batch", json={"calls": calls})
        assert r.status_code == 202, r.text
        assert all(wait_done(c, j["id"])["state"] == "succeeded" for j in r.json()["jobs"])
        for k, sid in enumerate(sids):
            out = c.post(f"/v1/environments/my-env/sessions/{sid}", json=read_log()).json()["output"].split()
            assert out == [str(i) for i in range(30) if i % 3 == k]


def test_cancel_queued_removes_it_and_cancel_running_kills_it(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"cx-{uuid.uuid4()}")
        running = c.post(base, json=bash("sleep 30; echo never >> log.txt"), headers=ASYNC).json()
        queued = c.post(base, json=bash("echo queued >> log.txt"), headers=ASYNC).json()
        deadline = time.monotonic() + 30
        while c.get(f"/v1/jobs/{running['id']}").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.post(f"/v1/jobs/{queued['id']}/cancel").json()["state"] == "cancelled"
        started = time.monotonic()
        c.post(f"/v1/jobs/{running['id']}/cancel")
        assert wait_done(c, running["id"])["state"] == "cancelled"
        assert time.monotonic() - started < 15
        ps = c.post(base, json=bash("ps -eo args | grep -c '[s]leep 30' || true")).json()["output"].strip()
        assert ps == "0"
        log = c.post(base, json=read_log()).json()
        assert log.get("is_error") is True  # neither the cancelled nor the killed job wrote


def test_idempotency_replay_conflict_and_concurrent_duplicates(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = resume(c, f"idem-{uuid.uuid4()}")
        key = {"Idempotency-Key": f"k-{uuid.uuid4()}", **ASYNC}
        first = c.post(base, json=bash("echo once >> log.txt"), headers=key).json()
        again = c.post(base, json=bash("echo once >> log.txt"), headers=key).json()
        assert again["id"] == first["id"]
        other = c.post(base, json=bash("echo other"), headers=key)
        assert other.status_code == 422
        assert other.json()["type"].endswith("/idempotency_conflict")
        key2 = {"Idempotency-Key": f"k-{uuid.uuid4()}", **ASYNC}

        def submit(_: int) -> str:
            with fleet.client() as cc:
                return str(cc.post(base, json=bash("echo dup >> log.txt"), headers=key2).json()["id"])

        with ThreadPoolExecutor(16) as pool:
            ids = set(pool.map(submit, range(16)))
        assert len(ids) == 1
        wait_done(c, ids.pop())
        wait_done(c, first["id"])
        assert c.post(base, json=read_log()).json()["output"].split() == ["once", "dup"]
