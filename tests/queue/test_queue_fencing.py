"""Fencing on real Redis: a worker whose lease is gone (expired, new epoch) can write nothing."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from queue_testkit import job

from common.queue import JobKind, JobState, Lease, LeaseLost, NewJob, Queue


async def take(queue: Queue, worker: str) -> tuple[Lease, str]:
    [handoff] = await queue.take_work(worker, 10)
    return handoff.lease, handoff.job.id


async def test_stale_owner_cannot_complete_fail_retry_release_or_write(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p", secrets={"K": "v"}))
    await queue.enqueue(job("s", 1))
    old, jid = await take(queue, "old")
    assert jid == res.job_id
    # when its lease expires and the reconciler repairs the session, a new owner takes it
    await redis_client.delete("af:lease:{env/s}")
    await redis_client.zadd("af:active", {"env/s": 0})  # its expiry time has passed
    assert await queue.repair_expired_leases() == 1
    new, jid2 = await take(queue, "new")
    assert jid2 == jid and new.epoch == old.epoch + 2
    # then every write of the old owner is refused and changes nothing
    with pytest.raises(LeaseLost):
        await queue.complete(old, jid, JobState.SUCCEEDED, result={"by": "old"})
    with pytest.raises(LeaseLost):
        await queue.complete(old, jid, JobState.FAILED, error={"title": "x"})
    with pytest.raises(LeaseLost):
        await queue.retry_later(old, jid, "flaky", 0)
    with pytest.raises(LeaseLost):
        await queue.append_output(old, jid, "stdout", "stale")
    with pytest.raises(LeaseLost):
        await queue.update_session(old, {"state": "running"})
    with pytest.raises(LeaseLost):
        await queue.take_secrets(old, jid)
    assert await queue.release(old) is False
    rec = await queue.get_job(jid)
    assert rec is not None and rec.state == JobState.RUNNING and rec.attempts == 0
    assert rec.epoch == new.epoch
    assert await redis_client.get("af:lease:{env/s}") == f"new:{new.epoch}".encode()
    assert not await redis_client.exists(f"af:out:{jid}")
    # and the new owner still can
    assert await queue.take_secrets(new, jid) == {"K": "v"}
    nxt = await queue.complete(new, jid, JobState.SUCCEEDED, result={"by": "new"}, take_next=True)
    assert nxt is not None and nxt.payload == {"i": 1} and nxt.state == JobState.RUNNING


async def test_update_session_refuses_queue_fields(queue: Queue) -> None:
    await queue.enqueue(job("s", 0))
    lease, _ = await take(queue, "w")
    with pytest.raises(ValueError):
        await queue.update_session(lease, {"epoch": "99"})


async def test_taking_an_owned_or_empty_session_takes_nothing(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    await queue.enqueue(job("s", 0))
    lease, jid = await take(queue, "a")
    # a duplicate notification for an owned session is consumed without effect
    await redis_client.xadd("af:ready", {"s": "env/s"})
    assert await queue.take_work("b", 10) == []
    assert await redis_client.xlen("af:ready") == 0
    assert await redis_client.get("af:lease:{env/s}") == f"a:{lease.epoch}".encode()
    assert await queue.complete(lease, jid, JobState.SUCCEEDED, result={}, take_next=True) is None
    await redis_client.xadd("af:ready", {"s": "env/s"})
    assert await queue.take_work("b", 10) == []
    assert not await redis_client.exists("af:lease:{env/s}")
