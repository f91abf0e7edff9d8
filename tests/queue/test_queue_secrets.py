"""Sealed env values on real Redis: kept for the job's life (retries included), gone at its end."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from queue_testkit import run_repairs

from common.queue import JobContext, JobKind, JobState, NewJob, Queue, RetryLater
from common.queue.waiter import JobWaiter


async def test_secrets_survive_a_retry_and_are_deleted_when_the_job_ends(
    queue: Queue, redis_client: aioredis.Redis, start_consumer: Any
) -> None:
    seen: list[dict[str, str] | None] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        seen.append(await ctx.take_secrets())
        if len(seen) == 1:  # a start that never reached the guest: retried in place
            raise RetryLater("guest unavailable")
        return {"ok": True}

    # given a job with sealed values, whose first start fails before the guest saw it
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p", secrets={"K": "v"}))
    key = f"af:sec:{res.job_id}"
    ttl_ms = await redis_client.pttl(key)
    assert 0 < ttl_ms <= queue.config.jobs.ttl_s * 1000  # the job's TTL is their backstop
    waiter, stop = JobWaiter(queue), asyncio.Event()
    repairs = asyncio.create_task(run_repairs(queue, 0.05, stop))  # re-notifies after the backoff
    try:
        start_consumer(handler)
        done = await waiter.wait(res.job_id, 10)
    finally:
        stop.set()
        await repairs
        await waiter.close()
    # then the retry got the same values, and once the job ended they are gone
    assert done is not None and done.state == JobState.SUCCEEDED
    assert seen == [{"K": "v"}, {"K": "v"}]
    assert not await redis_client.exists(key)


async def test_secrets_are_deleted_when_a_queued_job_is_cancelled(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p"))  # the head, never taken
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p", secrets={"K": "v"}))
    assert await redis_client.exists(f"af:sec:{res.job_id}")
    await queue.cancel(res.job_id)
    assert not await redis_client.exists(f"af:sec:{res.job_id}")


async def test_a_job_whose_secrets_expired_reads_none(queue: Queue, redis_client: aioredis.Redis) -> None:
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p", secrets={"K": "v"}))
    [handoff] = await queue.take_work("w", 1)
    await redis_client.delete(f"af:sec:{res.job_id}")  # as its TTL would
    assert await queue.take_secrets(handoff.lease, res.job_id) is None
