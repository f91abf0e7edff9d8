"""The reconciler's repair primitives on real Redis, one failure mode each."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from queue_testkit import job

from common.queue import JobState, Queue


async def test_expired_lease_gets_new_epoch_and_notification(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    await queue.enqueue(job("s", 0))
    [acquired] = await queue.take_work("w", 10)
    assert await queue.repair_expired_leases() == 0  # still valid
    await redis_client.delete("af:lease:{env/s}")  # expiry
    await redis_client.zadd("af:active", {"env/s": 0})  # as if its expiry time has passed
    assert await queue.repair_expired_leases() == 1
    assert int(await redis_client.hget("af:sess:{env/s}", "epoch")) == acquired.lease.epoch + 1
    assert [e[1][b"s"] for e in await redis_client.xrange("af:ready")] == [b"env/s"]
    assert await queue.repair_expired_leases() == 0


async def test_due_delayed_session_is_notified(queue: Queue, redis_client: aioredis.Redis) -> None:
    res = await queue.enqueue(job("s", 0))
    [taken] = await queue.take_work("w", 10)
    lease = taken.lease
    assert await queue.retry_later(lease, res.job_id, "busy", 0, delay_s=0.05) == ("retry", 1)
    assert await redis_client.xlen("af:ready") == 0
    # an enqueue during the backoff does not bypass it
    await queue.enqueue(job("s", 1))
    assert await redis_client.xlen("af:ready") == 0
    await asyncio.sleep(0.06)  # the backoff itself is what is being tested
    assert await queue.notify_due_delayed() == 1
    rec = await queue.get_job(res.job_id)
    assert rec is not None and rec.state == JobState.QUEUED and rec.attempts == 1
    [again] = await queue.take_work("w", 10)
    assert again.job.id == res.job_id


async def test_orphaned_work_is_notified_once(queue: Queue, redis_client: aioredis.Redis) -> None:
    await queue.enqueue(job("s", 0))
    await queue.enqueue(job("t", 0))
    # the notification of s vanished (e.g. trimmed); t's is fine
    [first, _] = await redis_client.xrange("af:ready")
    await redis_client.xdel("af:ready", first[0])
    assert await queue.notify_orphaned_work(page=1) == 1
    assert await queue.notify_orphaned_work() == 0
    sessions = sorted(e[1][b"s"] for e in await redis_client.xrange("af:ready"))
    assert sessions == [b"env/s", b"env/t"]


async def test_repair_runs_all_passes(queue: Queue) -> None:
    counts = await queue.repair()
    assert counts == {"expired_leases": 0, "due_delayed": 0, "dead_workers": 0, "orphaned_work": 0}
