"""JobWaiter on real Redis: one subscription, resolves on terminal, survives missed notifications."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from queue_testkit import job, wait_for

from common.queue import JobState, JobWaiter, Outcome, Queue
from common.queue.queue import new_job_id
from common.queue.scripts import DONE_INLINE_MAX


async def finish(queue: Queue, session: str = "env/s", result: dict[str, Any] | None = None) -> None:
    """Run the head job of `session` to success through the worker-side primitives."""
    [acquired] = await queue.take_work("w", 1)
    assert acquired.lease.session == session
    await queue.complete(acquired.lease, acquired.job.id, JobState.SUCCEEDED,
                         result={"ok": 1} if result is None else result)


async def pubsub_clients(redis: aioredis.Redis) -> int:
    return sum(1 for c in await redis.client_list() if int(c.get("sub", 0)) > 0)


async def test_many_waiters_share_one_subscription(queue: Queue, redis_client: aioredis.Redis) -> None:
    ids = [(await queue.enqueue(job(f"s{n}", 0))).job_id for n in range(5)]
    waiter = JobWaiter(queue)
    try:
        waits = [asyncio.create_task(waiter.wait(jid, 10)) for jid in ids for _ in range(2)]
        await wait_for(lambda: _ge(redis_client, 1), 5, "subscription")
        assert await pubsub_clients(redis_client) == 1
        for n in range(5):
            await finish(queue, f"env/s{n}")
        records = await asyncio.gather(*waits)
    finally:
        await waiter.close()
    assert all(r is not None and r.state == JobState.SUCCEEDED for r in records)


async def test_already_finished_missing_and_timeout(queue: Queue) -> None:
    waiter = JobWaiter(queue)
    try:
        res = await queue.enqueue(job("s", 0))
        pending = await waiter.wait(res.job_id, 0.05)
        assert pending is not None and pending.state == JobState.QUEUED
        await finish(queue)
        done = await waiter.wait(res.job_id, 5)
        assert done is not None and done.state == JobState.SUCCEEDED
        assert await waiter.wait("missing", 5) is None
    finally:
        await waiter.close()


async def test_notification_missed_while_reconnecting_is_caught(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    res = await queue.enqueue(job("s", 0))
    waiter = JobWaiter(queue)
    try:
        task = asyncio.create_task(waiter.wait(res.job_id, 10))
        await wait_for(lambda: _ge(redis_client, 1), 5, "subscription")
        # when the subscription connection drops and the job finishes meanwhile
        await redis_client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await finish(queue)
        rec = await task
    finally:
        await waiter.close()
    assert rec is not None and rec.state == JobState.SUCCEEDED


async def _ge(redis: aioredis.Redis, n: int) -> bool:
    return await pubsub_clients(redis) >= n


@pytest.fixture
async def live_waiter(queue: Queue, redis_client: aioredis.Redis) -> AsyncIterator[JobWaiter]:
    """A waiter whose subscription is up (watches taken now rely on notifications alone)."""
    waiter = JobWaiter(queue)
    waiter.start()
    await wait_for(lambda: _ge(redis_client, 1), 5, "subscription")
    await asyncio.wait_for(waiter._subscribed.wait(), 5)
    yield waiter
    await waiter.close()


async def test_watched_before_enqueue_answers_from_the_notification_alone(
    queue: Queue, redis_client: aioredis.Redis, live_waiter: JobWaiter
) -> None:
    """The sync path: watch, enqueue, finish; the record is deleted before the answer is awaited,
    so only the notification can have carried it."""
    job_id = new_job_id()
    with live_waiter.watch(job_id) as watch:
        await queue.enqueue(job("s", 0), job_id=job_id)
        await finish(queue, result={"output": "hi"})
        await redis_client.delete(queue.keys.job(job_id))
        outcome = await watch.outcome(5)
    assert outcome == Outcome(JobState.SUCCEEDED, result={"output": "hi"})
    assert live_waiter._waiting == {}


async def test_large_answer_is_read_from_the_record(queue: Queue, live_waiter: JobWaiter) -> None:
    big = {"output": "x" * (DONE_INLINE_MAX + 1)}
    job_id = new_job_id()
    with live_waiter.watch(job_id) as watch:
        await queue.enqueue(job("s", 0), job_id=job_id)
        await finish(queue, result=big)
        outcome = await watch.outcome(5)
    assert outcome == Outcome(JobState.SUCCEEDED, result=big)


async def test_follow_sees_a_job_that_ended_before_it(queue: Queue, live_waiter: JobWaiter) -> None:
    """An idempotent replay follows a job that may have ended long ago: no notification will come."""
    res = await queue.enqueue(job("s", 0))
    await finish(queue)
    with live_waiter.follow(res.job_id) as watch:
        outcome = await watch.outcome(5)
    with live_waiter.watch("no-such-job") as watch:
        missing = await watch.outcome(0.05)
    assert outcome == Outcome(JobState.SUCCEEDED, result={"ok": 1})
    assert missing is None


async def test_watch_taken_before_a_resubscription_reads_the_record(
    queue: Queue, redis_client: aioredis.Redis, live_waiter: JobWaiter
) -> None:
    """A watch registered under one subscription whose notification fell into the reconnect gap."""
    job_id = new_job_id()
    with live_waiter.watch(job_id) as watch:
        await queue.enqueue(job("s", 0), job_id=job_id)
        generation = live_waiter._generation
        await redis_client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await finish(queue)
        outcome = await watch.outcome(10)
    assert outcome == Outcome(JobState.SUCCEEDED, result={"ok": 1})
    assert live_waiter._generation > generation


async def test_a_fresh_processs_first_watch_waits_for_its_job(queue: Queue) -> None:
    """The first sync request of a just-started API process: its watch starts the subscription,
    whose first re-check runs before the job is enqueued (it finds no such job yet). The answer
    must still be the job's outcome, not a 'not done in time' at once."""
    waiter = JobWaiter(queue)
    job_id = new_job_id()
    try:
        with waiter.watch(job_id) as watch:
            await wait_for(lambda: _rechecked(watch), 5, "the first subscription's re-check")
            await queue.enqueue(job("s", 0), job_id=job_id)
            answer = asyncio.create_task(watch.outcome(10))
            await asyncio.sleep(0.2)
            assert not answer.done()
            await finish(queue)
            outcome = await answer
    finally:
        await waiter.close()
    assert outcome == Outcome(JobState.SUCCEEDED, result={"ok": 1})


async def _rechecked(watch: Any) -> bool:
    return bool(watch._future.done())
