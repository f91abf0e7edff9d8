"""Consumer runtime on real Redis: order, fairness, retries, DLQ, failures, cancel, lease loss, stop."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from queue_testkit import job, run_repairs, wait_for

from common.queue import (
    Consumer,
    JobCancelled,
    JobContext,
    JobFailed,
    JobState,
    JobWaiter,
    Queue,
    RetryLater,
)
from common.queue.models import PROBLEM_RETRIES_EXHAUSTED

StartConsumer = Callable[..., Consumer]


async def all_terminal(queue: Queue, ids: list[str]) -> bool:
    for jid in ids:
        rec = await queue.get_job(jid)
        if rec is None or not rec.terminal:
            return False
    return True


@pytest.fixture
async def repairs(queue: Queue) -> Any:
    """The reconciler's repair loop (what brings back delayed sessions and expired leases)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_repairs(queue, 0.05, stop))
    yield
    stop.set()
    await task


async def test_jobs_run_in_fifo_order_and_results_are_stored(
    queue: Queue, start_consumer: StartConsumer
) -> None:
    seen: list[tuple[str, int]] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        seen.append((ctx.job.session_id, ctx.job.payload["i"]))
        await asyncio.sleep(0)
        return {"i": ctx.job.payload["i"]}

    ids = [(await queue.enqueue(job(f"s{n % 3}", n // 3))).job_id for n in range(30)]
    start_consumer(handler, concurrency=8)
    await wait_for(lambda: all_terminal(queue, ids), 10, "all jobs terminal")
    for s in ("s0", "s1", "s2"):
        assert [i for sess, i in seen if sess == s] == list(range(10))
    rec = await queue.get_job(ids[-1])
    assert rec is not None and rec.state == JobState.SUCCEEDED and rec.result == {"i": 9}
    assert rec.started_at is not None and rec.finished_at is not None and rec.epoch >= 1


async def test_fairness_yields_after_k_jobs(queue: Queue, start_consumer: StartConsumer) -> None:
    # given two sessions with 6 jobs each, one session at a time, 2 jobs per turn
    order: list[str] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        order.append(ctx.job.session_id)
        return {}

    ids = [(await queue.enqueue(job(s, i))).job_id for s in ("a", "b") for i in range(6)]
    start_consumer(handler, concurrency=1, jobs_per_turn=2)
    await wait_for(lambda: all_terminal(queue, ids), 10, "all jobs terminal")
    # then turns alternate: the hot session cannot run more than K in a row while the other waits
    assert order == ["a", "a", "b", "b"] * 3


async def test_retry_later_keeps_job_at_head_then_succeeds(
    queue: Queue, start_consumer: StartConsumer, repairs: None
) -> None:
    calls: list[tuple[int, int]] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        calls.append((ctx.job.payload["i"], ctx.job.attempts))
        if ctx.job.payload["i"] == 0 and ctx.job.attempts < 2:
            raise RetryLater("substrate unavailable")
        return {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    await wait_for(lambda: all_terminal(queue, ids), 10, "both jobs terminal")
    # job 1 never starts before job 0 succeeded
    assert calls == [(0, 0), (0, 1), (0, 2), (1, 0)]
    rec = await queue.get_job(ids[0])
    assert rec is not None and rec.state == JobState.SUCCEEDED and rec.attempts == 2


async def test_exhausted_retries_fail_into_dlq_and_session_moves_on(
    queue: Queue, start_consumer: StartConsumer, repairs: None, redis_client: aioredis.Redis
) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        if ctx.job.payload["i"] == 0:
            raise RetryLater("no free workers available")
        return {"ok": True}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    await wait_for(lambda: all_terminal(queue, ids), 10, "both jobs terminal")
    dead = await queue.get_job(ids[0])
    assert dead is not None and dead.state == JobState.FAILED and dead.attempts == 3
    assert dead.error is not None and dead.error["type"] == PROBLEM_RETRIES_EXHAUSTED
    assert dead.error["detail"] == "no free workers available" and dead.error["attempts"] == 3
    dlq = await redis_client.xrange("af:dlq")
    assert [(f[b"job"].decode(), f[b"reason"]) for _, f in dlq] == [(ids[0], b"no free workers available")]
    nxt = await queue.get_job(ids[1])
    assert nxt is not None and nxt.state == JobState.SUCCEEDED


async def test_job_failed_and_unexpected_errors(
    queue: Queue, start_consumer: StartConsumer, repairs: None
) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        if ctx.job.payload["i"] == 0:
            raise JobFailed({"type": "urn:test", "title": "bad request", "status": 400})
        if ctx.job.attempts == 0:
            raise RuntimeError("bug")
        return {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    await wait_for(lambda: all_terminal(queue, ids), 10, "both jobs terminal")
    failed, retried = await queue.get_job(ids[0]), await queue.get_job(ids[1])
    assert failed is not None and failed.state == JobState.FAILED and failed.error == {
        "type": "urn:test", "title": "bad request", "status": 400}
    assert retried is not None and retried.state == JobState.SUCCEEDED and retried.attempts == 1


async def test_cancel_running_job_reaches_the_handler(queue: Queue, start_consumer: StartConsumer) -> None:
    started = asyncio.Event()

    async def handler(ctx: JobContext) -> dict[str, Any]:
        if ctx.job.payload["i"] == 0:
            started.set()
            await ctx.cancelled.wait()
            assert ctx.cancel_requested
            raise JobCancelled("stopped by request")
        return {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    await asyncio.wait_for(started.wait(), 5)
    rec = await queue.cancel(ids[0])
    # read back after the cancel: the handler may already have honoured it (a finished job's
    # compact record keeps no cancel flag)
    assert rec is not None
    assert (rec.state, rec.cancel_requested) in ((JobState.RUNNING, True), (JobState.CANCELLED, False))
    await wait_for(lambda: all_terminal(queue, ids), 10, "both jobs terminal")
    done = await queue.get_job(ids[0])
    assert done is not None and done.state == JobState.CANCELLED
    assert done.error is not None and done.error["detail"] == "stopped by request"


async def test_context_writes_output_session_and_peeks(queue: Queue, start_consumer: StartConsumer) -> None:
    peeked: list[str | None] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        if ctx.job.payload["i"] == 0:
            for n in range(3):
                await ctx.append_output("stdout", f"line {n}\n")
            await ctx.update_session(state="running", actor="a-1", last_activity=123)
            nxt = await ctx.peek_next_job()
            peeked.append(nxt.id if nxt else None)
            assert (await ctx.session())["actor"] == "a-1"
        return {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    waiter = JobWaiter(queue)
    try:
        first_out = await queue.read_output(ids[0], block_ms=5000)
        rec = await waiter.wait(ids[1], 10)
    finally:
        await waiter.close()
    assert first_out[0][1] == {"stream": "stdout", "data": "line 0\n"}
    assert rec is not None and rec.state == JobState.SUCCEEDED
    out = await queue.read_output(ids[0])
    assert [e[1].get("data") for e in out] == ["line 0\n", "line 1\n", "line 2\n", None]
    assert out[-1][1] == {"event": "end"}
    assert await queue.read_output(ids[0], after=out[-1][0]) == []
    assert peeked == [ids[1]]
    sess = await queue.get_session("env", "s")
    # the handler's fields stay; finishing a job stamps last_activity (idle suspension counts from it)
    assert sess is not None and sess["state"] == "running" and sess["actor"] == "a-1"
    assert time.time() - float(sess["last_activity"]) < 60


@dataclass
class StuckFirst:
    """A handler stuck on the session's first job until cancelled; it answers its epoch after."""

    job_id: str = ""
    contexts: list[JobContext] = field(default_factory=list)
    #: When the stuck run ended (monotonic): only a cancellation ends it.
    ended_at: list[float] = field(default_factory=list)

    async def __call__(self, ctx: JobContext) -> dict[str, Any]:
        self.contexts.append(ctx)
        if len(self.contexts) > 1:
            return {"epoch": ctx.epoch}
        try:
            await asyncio.sleep(60)
        finally:
            self.ended_at.append(time.monotonic())
        return {}

    async def resumed_elsewhere(self, queue: Queue) -> None:
        """The job ran again at the head under a new epoch and completed once."""
        await wait_for(lambda: all_terminal(queue, [self.job_id]), 10, "the job to be resumed")
        rec = await queue.get_job(self.job_id)
        assert rec is not None and rec.state == JobState.SUCCEEDED and rec.result == {"epoch": rec.epoch}
        assert rec.epoch > self.contexts[0].epoch and len(self.contexts) == 2


async def start_stuck(queue: Queue, start_consumer: StartConsumer) -> tuple[Consumer, StuckFirst]:
    """A consumer whose handler is stuck on the one job of session `s`, once that job started."""
    stuck = StuckFirst((await queue.enqueue(job("s", 0))).job_id)
    consumer = start_consumer(stuck, worker_id="w1")
    await wait_for(lambda: _true(bool(stuck.contexts)), 5, "the job to start")
    return consumer, stuck


async def test_lost_lease_cancels_work_logs_and_job_resumes_elsewhere(
    queue: Queue, start_consumer: StartConsumer, repairs: None, redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="atefleet.queue.consumer")
    first, stuck = await start_stuck(queue, start_consumer)
    # when the lease disappears behind the worker's back (as after a long stall)
    await redis_client.delete("af:lease:{env/s}")
    await wait_for(lambda: _true(first.stats["leases_lost"] == 1), 5, "the loss to be noticed")
    ctx = stuck.contexts[0]
    assert ctx.lease_lost and ctx.cancelled.is_set() and len(stuck.ended_at) == 1
    assert "lease lost: session=env/s" in caplog.text
    # then the job is picked up again at the head under a new epoch and completes once
    await stuck.resumed_elsewhere(queue)


async def test_a_lease_expiring_while_its_renewal_hangs_cancels_the_handler_by_then(
    queue: Queue, start_consumer: StartConsumer, repairs: None, redis_client: aioredis.Redis,
) -> None:
    first, stuck = await start_stuck(queue, start_consumer)
    # when Redis stops answering for longer than the lease lasts (its renewal sent, no answer)
    pause_s = 3.0
    paused_at = time.monotonic()
    await redis_client.execute_command("CLIENT", "PAUSE", int(pause_s * 1000))
    while not stuck.ended_at and time.monotonic() < paused_at + pause_s + 1:
        await asyncio.sleep(0.02)
    # then the worker cancels the handler by the lease's expiry, not when Redis answers again
    ttl_s = queue.lease_ttl_ms / 1000
    assert stuck.ended_at and stuck.ended_at[0] - paused_at <= ttl_s + 0.3, "handler still running"
    assert stuck.contexts[0].lease_lost and first.stats["leases_lost"] == 1
    # and once Redis answers, the job resumes at the head under a new epoch and completes once
    await stuck.resumed_elsewhere(queue)


async def test_a_renewal_redis_applied_but_answered_after_the_expiry_here_releases_the_lease(
    queue: Queue, start_consumer: StartConsumer, repairs: None, redis_client: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, stuck = await start_stuck(queue, start_consumer)
    ttl_s = queue.lease_ttl_ms / 1000
    renew = queue.renew
    #: When the lease that late renewal set would expire in Redis (monotonic), once applied.
    redis_expiry: list[float] = []

    async def renewal_answered_late(leases: Any) -> list[int]:
        if redis_expiry:
            return await renew(leases)
        redis_expiry.append(math.inf)
        await asyncio.sleep(ttl_s / 2)  # it reaches Redis while the lease still lives there
        answers = await renew(leases)
        redis_expiry[0] = time.monotonic() + await redis_client.pttl("af:lease:{env/s}") / 1000
        await asyncio.sleep(ttl_s / 2)  # and its answer comes after the lease's expiry here
        return answers

    # when the next renewal of the stuck job's lease is applied by Redis but answered late
    monkeypatch.setattr(queue, "renew", renewal_answered_late)
    # (the handler's cancellation lands a loop turn after the loss is marked)
    await wait_for(lambda: _true(bool(stuck.ended_at)), 5, "the handler to end on the loss here")
    assert stuck.contexts[0].lease_lost
    # then once the answer comes, the worker releases the lease Redis renewed: the job runs again
    # under a new epoch before that renewal would have expired
    await wait_for(lambda: _true(len(stuck.contexts) == 2), 5, "the job to run again")
    assert time.monotonic() < redis_expiry[0], "the session waited for the renewed lease to expire"
    await stuck.resumed_elsewhere(queue)
    assert first.stats["leases_lost"] == 1


async def test_graceful_stop_finishes_current_job_and_releases(
    queue: Queue, start_consumer: StartConsumer
) -> None:
    started = asyncio.Event()

    async def handler(ctx: JobContext) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(0.2)
        return {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(3)]
    consumer = start_consumer(handler)
    await asyncio.wait_for(started.wait(), 5)
    await consumer.stop()
    first, second = await queue.get_job(ids[0]), await queue.get_job(ids[1])
    assert first is not None and first.state == JobState.SUCCEEDED
    assert second is not None and second.state == JobState.QUEUED
    # released and re-notified: another worker continues without waiting for a lease to expire
    start_consumer(handler, worker_id="w2")
    await wait_for(lambda: all_terminal(queue, ids), 5, "the rest to run")


async def test_stop_past_grace_cancels_and_releases_so_the_job_resumes(
    queue: Queue, start_consumer: StartConsumer
) -> None:
    runs: list[int] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        runs.append(ctx.epoch)
        if len(runs) == 1:
            await asyncio.sleep(60)
        return {}

    res = await queue.enqueue(job("s", 0))
    consumer = Consumer(queue, "w1", handler, block_ms=100, stop_grace_s=0.1)
    task = asyncio.create_task(consumer.run())
    await wait_for(lambda: _true(bool(runs)), 5, "the job to start")
    await consumer.stop()
    await task
    start_consumer(handler, worker_id="w2")
    await wait_for(lambda: all_terminal(queue, [res.job_id]), 5, "the job to resume")
    assert len(runs) == 2 and runs[1] > runs[0]


async def _true(value: bool) -> bool:
    return value


async def test_blocked_output_reader_wakes_when_a_job_ends_without_output(
    queue: Queue, start_consumer: StartConsumer
) -> None:
    release = asyncio.Event()

    async def handler(ctx: JobContext) -> dict[str, Any]:
        await release.wait()
        return {}

    res = await queue.enqueue(job("s", 0))
    start_consumer(handler)
    reader = asyncio.create_task(queue.read_output(res.job_id, block_ms=10_000))
    await asyncio.sleep(0.05)  # let the reader block (either order is correct; this is the hard one)
    release.set()
    out = await asyncio.wait_for(reader, 5)
    assert out[-1][1] == {"event": "end"}


async def test_cancel_request_missed_on_the_channel_reaches_the_handler_by_renewal(
    queue: Queue, start_consumer: StartConsumer, redis_client: aioredis.Redis
) -> None:
    started = asyncio.Event()

    async def handler(ctx: JobContext) -> dict[str, Any]:
        started.set()
        await asyncio.wait_for(ctx.cancelled.wait(), 5)
        raise JobCancelled()

    res = await queue.enqueue(job("s", 0))
    start_consumer(handler)
    await asyncio.wait_for(started.wait(), 5)
    # the flag is set without a message on the cancel channel (as if the message was lost)
    await redis_client.hset(f"af:job:{res.job_id}", "cx", "1")
    await wait_for(lambda: all_terminal(queue, [res.job_id]), 5, "the job to be cancelled")
    rec = await queue.get_job(res.job_id)
    assert rec is not None and rec.state == JobState.CANCELLED


async def test_scripts_flushed_from_redis_are_reloaded(queue: Queue, redis_client: aioredis.Redis) -> None:
    await queue.enqueue(job("s", 0))
    await redis_client.script_flush()
    results = await asyncio.gather(*(queue.enqueue(job("s", i)) for i in range(1, 4)))
    assert all(r.created for r in results) and await queue.queue_depth("env", "s") == 4


async def test_result_that_is_not_json_fails_the_job_instead_of_looping(
    queue: Queue, start_consumer: StartConsumer
) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        return {"not json": object()} if ctx.job.payload["i"] == 0 else {}

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    start_consumer(handler)
    await wait_for(lambda: all_terminal(queue, ids), 5, "both jobs terminal")
    bad, good = await queue.get_job(ids[0]), await queue.get_job(ids[1])
    assert bad is not None and bad.state == JobState.FAILED and bad.error is not None
    assert bad.error["type"] == "https://atefleet.dev/problems/invalid_result"
    assert good is not None and good.state == JobState.SUCCEEDED
