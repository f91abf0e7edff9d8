"""The dead-letter queue's replay and discard on real Redis: what `replay_dlq.lua` writes, and
what it refuses."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from queue_testkit import job

from common.queue import JobState, Queue
from common.queue.dlq import DeadLetters, ReplayRefused, is_entry_id


async def _dead(queue: Queue, session: str, n: int) -> tuple[str, str]:
    """A job of `session` that failed its attempts into the DLQ: (job id, DLQ entry id)."""
    result = await queue.enqueue(job(session, n))
    for attempt in range(queue.config.workers.max_attempts):
        [taken] = await queue.take_work("w", 10)
        outcome = await queue.retry_later(taken.lease, result.job_id, "substrate down", attempt, delay_s=0)
        await queue.notify_due_delayed()  # no backoff in a test
    assert outcome[0] == "dead"
    [newest], _ = await DeadLetters(queue).page(None, 1)
    assert newest.job_id == result.job_id and newest.reason == "substrate down"
    return result.job_id, newest.id


async def test_replay_puts_the_same_job_at_the_sessions_tail(
        queue: Queue, redis_client: aioredis.Redis) -> None:
    # given a dead job with output, and a newer job of the same session queued meanwhile
    jid, entry = await _dead(queue, "s", 0)
    await redis_client.xadd(queue.keys.output(jid), {"stream": "stdout", "data": "old"})
    await redis_client.hset(queue.keys.job(jid), mapping={"o": '["stdout","old"]', "tr": "1"})  # folded
    newer = (await queue.enqueue(job("s", 1))).job_id
    dlq = DeadLetters(queue)
    assert (await dlq.get(entry)) is not None and await dlq.size() == 1

    # when it is replayed
    assert await dlq.replay(entry) == jid

    # then it is queued behind the newer job, attempts reset, old output and failure gone
    fifo = [x.decode() for x in await redis_client.lrange(queue.keys.fifo("env/s"), 0, -1)]
    assert fifo == [newer, jid]
    record = await queue.get_job(jid)
    assert record is not None and record.state == JobState.QUEUED
    assert record.attempts == 0 and record.error is None and record.finished_at is None
    assert await redis_client.ttl(queue.keys.job(jid)) == -1  # no longer expiring
    assert not await redis_client.exists(queue.keys.output(jid))
    assert await redis_client.hmget(queue.keys.job(jid), ["o", "tr"]) == [None, None]
    assert await dlq.size() == 0 and await dlq.get(entry) is None
    last = (await redis_client.xrevrange(queue.keys.events, count=1))[0][1]
    assert last[b"job"] == jid.encode() and last[b"state"] == b"queued"

    # and a second replay finds nothing
    with pytest.raises(ReplayRefused) as refused:
        await dlq.replay(entry)
    assert refused.value.reason == "missing"


async def test_replay_refuses_a_job_no_longer_failed_and_drops_an_expired_one(
        queue: Queue, redis_client: aioredis.Redis) -> None:
    jid, entry = await _dead(queue, "s", 0)
    dlq = DeadLetters(queue)
    await redis_client.hset(queue.keys.job(jid), "st", "succeeded")  # type: ignore[misc]
    with pytest.raises(ReplayRefused) as refused:
        await dlq.replay(entry)
    assert (refused.value.reason, refused.value.state) == ("not_failed", "succeeded")
    assert await dlq.size() == 1  # kept: nothing written

    await redis_client.delete(queue.keys.job(jid))  # its TTL ran out
    with pytest.raises(ReplayRefused) as refused:
        await dlq.replay(entry)
    assert refused.value.reason == "expired" and await dlq.size() == 0


async def test_discard_drops_only_the_entry(queue: Queue) -> None:
    jid, entry = await _dead(queue, "s", 0)
    dlq = DeadLetters(queue)
    assert await dlq.discard(entry) is True
    assert await dlq.discard(entry) is False
    record = await queue.get_job(jid)
    assert record is not None and record.state == JobState.FAILED


async def test_pages_go_newest_first(queue: Queue) -> None:
    entries = [(await _dead(queue, f"s{i}", i))[1] for i in range(5)]
    dlq = DeadLetters(queue)
    first, cursor = await dlq.page(None, 3)
    assert [e.id for e in first] == entries[::-1][:3] and cursor == entries[2]
    rest, cursor = await dlq.page(cursor, 3)
    assert [e.id for e in rest] == entries[::-1][3:] and cursor is None


def test_entry_ids() -> None:
    assert is_entry_id("1700000000000-0") and is_entry_id("1-12")
    for bad in ["", "1", "1-", "-1", "a-1", "1-0-0", "$", "+", "-", "1-0\n", "9" * 60 + "-0"]:
        assert not is_entry_id(bad), bad
