"""Idle suspension end to end: real worker, real local Substrate, a running reconciler,
idle_timeout_s = 1 and a 0.2 s period."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from common.queue import JobKind
from common.substrate import ActorStatus
from tests.reconciler.conftest import ENV, Fleet, wait_for


async def _kinds_enqueued(fleet: Fleet, sid: str) -> list[str]:
    """Kinds of every job ever enqueued for the session (from `events`)."""
    raw = await fleet.queue.redis.xrange(fleet.queue.keys.events)
    ids = [f[b"job"].decode() for _, f in raw if f.get(b"session") == f"{ENV}/{sid}".encode()
           and f.get(b"state") == b"queued"]
    jobs = [await fleet.queue.get_job(i) for i in dict.fromkeys(ids)]
    return [str(j.kind) for j in jobs if j is not None]


async def test_idle_session_is_suspended_within_timeout_plus_one_period(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet()
    fleet.start_worker()
    fleet.start_reconciler()
    await fleet.run("idle", JobKind.RESUME)
    last = float((await fleet.session("idle"))["last_activity"])
    await wait_for(lambda: fleet.state_is("idle", "suspended"), 10, "idle suspension")
    # the idle job was enqueued by the first pass after the timeout; the suspend itself follows
    took_s = time.time() - last
    timeout_s, period_s = 1.0, fleet.config.reconciler.period_s
    assert took_s <= timeout_s + period_s + 1.0, took_s
    actor = await fleet.actor("idle")
    assert actor is not None and actor.status is ActorStatus.SUSPENDED
    assert await _kinds_enqueued(fleet, "idle") == ["resume", "suspend_if_idle"]


async def test_busy_sessions_are_not_suspended(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet()
    worker = fleet.start_worker()
    for sid in ("calling", "queued", "background"):
        await fleet.run(sid, JobKind.RESUME)
    await fleet.run("background", JobKind.TOOL, _bash("sleep 30", background=True))
    calling = await fleet.bash("calling", "sleep 3; echo done")
    fleet.start_reconciler()
    # a running call (3 s, three idle timeouts): the session stays running throughout
    job = await fleet.wait_job(calling, 10)
    assert job.state == "succeeded" and "done" in str(job.result)
    assert await _kinds_enqueued(fleet, "calling") == ["resume", "tool"]
    # a background process: the worker declines the idle job; the session keeps running
    await wait_for(lambda: _declined(fleet, "background"), 5, "the idle job to be declined")
    assert await fleet.state_is("background", "running")
    # a queued call (no worker takes it): no idle job joins it, however long it waits
    await worker.halt()
    spare = fleet.start_worker("w2")
    await fleet.run("queued", JobKind.RESUME)
    await spare.halt()
    queued = await fleet.bash("queued", "echo later")
    started = time.monotonic()
    quiet_s = 1.0 + 3 * fleet.config.reconciler.period_s
    await wait_for(lambda: _after(started, quiet_s), 5, "a few idle passes")
    assert await fleet.queue.queue_depth(ENV, "queued") == 1
    fleet.start_worker("w3")
    job = await fleet.wait_job(queued, 10)
    assert job.state == "succeeded" and "later" in str(job.result)


async def test_a_call_racing_the_idle_suspend_runs_on_a_resumed_actor(make_fleet: Any) -> None:
    # Suspends take 1 s here, so the call surely arrives while the idle suspend is under way.
    fleet: Fleet = await make_fleet(local_substrate={"faults": {"latency_ms": {"SuspendActor": 1000}}})
    fleet.start_worker()
    await fleet.run("race", JobKind.RESUME)
    await fleet.run("race", JobKind.TOOL, _bash("echo kept > notes.txt"))
    fleet.start_reconciler()
    idle_job = await _wait_idle_job_running(fleet, "race")
    # the worker re-checked idleness under the lease and is now suspending (slowly)
    deadline = time.monotonic() + 10
    while (await fleet.session("race")).get("state") != "suspending":
        assert time.monotonic() < deadline, "the idle suspend never started suspending"
        await asyncio.sleep(0.01)
    call = await fleet.bash("race", "cat notes.txt; echo more >> notes.txt; cat notes.txt", auto_resume=True)
    # then the idle suspend completes, and the call resumes the actor and finds every file
    idle = await fleet.wait_job(idle_job, 10)
    assert idle.result is not None and idle.result.get("idle_suspended") is True, idle.result
    job = await fleet.wait_job(call, 20)
    assert job.state == "succeeded"
    output = str(job.result)
    assert output.count("kept") == 2 and "more" in output
    # it started only once the idle suspend had finished: it ran on a resumed actor
    assert (job.started_at or 0) >= (idle.finished_at or 0)


def _bash(command: str, **arguments: Any) -> dict[str, Any]:
    from common.tool_calls import ToolCall

    return ToolCall(call_id="c", name="bash", arguments={"command": command, **arguments},
                    format="seed").job_payload()


async def _after(started: float, seconds: float) -> bool:
    return time.monotonic() - started >= seconds


async def _declined(fleet: Fleet, sid: str) -> bool:
    raw = await fleet.queue.redis.xrange(fleet.queue.keys.events)
    for _, f in raw:
        if f.get(b"session") == f"{ENV}/{sid}".encode() and f.get(b"state") == b"succeeded":
            job = await fleet.queue.get_job(f[b"job"].decode())
            if job is not None and job.kind == "suspend_if_idle":
                assert job.result is not None and job.result["status"] == "skipped", job.result
                return True
    return False


async def _wait_idle_job_running(fleet: Fleet, sid: str) -> str:
    found: list[str] = []

    async def running() -> bool:
        ids = await fleet.queue.redis.lrange(fleet.queue.keys.fifo(f"{ENV}/{sid}"), 0, 0)
        job = await fleet.queue.get_job(ids[0].decode()) if ids else None
        if job is not None and job.kind == "suspend_if_idle" and job.state == "running":
            found.append(job.id)
        return bool(found)

    await wait_for(running, 10, "the idle job to start", every_s=0.01)
    return found[0]
