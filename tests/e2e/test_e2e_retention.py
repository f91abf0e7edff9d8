"""Retention through the real fleet: a quick call's output is folded into its record (no stream
kept), and SSE still replays it, resumable by id, for the finished job."""

from __future__ import annotations

from test_e2e_async import ASYNC, _sse, bash, resume, wait_done

from tests.e2e.conftest import RunningFleet


def test_a_finished_quick_call_keeps_no_stream_and_sse_replays_its_output(fleet: RunningFleet) -> None:
    r = fleet.redis_client()
    with fleet.client() as c:
        base = resume(c, "fold-1")
        job = c.post(base, json=bash("echo one; echo two >&2"), headers=ASYNC).json()
        assert wait_done(c, job["id"])["state"] == "succeeded"
        # then no output stream is kept, and the record is compact (no payload)
        assert not r.exists(f"af:out:{job['id']}")
        assert r.hget(f"af:job:{job['id']}", "pl") is None
        # and SSE gives the output, then the result, resumable after the first event
        events = _sse(c, job["id"])
        outputs = [(e[2]["stream"], e[2]["data"]) for e in events if e[1] == "output"]
        assert "".join(d for s, d in outputs if s == "stdout") == "one\n"
        assert "".join(d for s, d in outputs if s == "stderr") == "two\n"
        assert events[-1][1] == "result" and events[-1][2]["state"] == "succeeded"
        rest = _sse(c, job["id"], last_id=events[0][0])
        assert rest == events[1:] or [e[:3] for e in rest] == [e[:3] for e in events[1:]]
    r.close()
