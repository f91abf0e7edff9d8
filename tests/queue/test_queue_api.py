"""Queue API side on real Redis: enqueue, idempotency, cancel, output, sessions, webhook attempts."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from queue_testkit import job

from common.queue import IdempotencyConflict, JobKind, JobState, NewJob, Queue
from common.redis.client import RedisClient


async def test_enqueue_records_job_and_notifies_once_per_session(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given two jobs for one session and one for another
    a = await queue.enqueue(job("s1", 0))
    b = await queue.enqueue(job("s1", 1))
    await queue.enqueue(job("s2", 0))
    # then the FIFO keeps order and each session has exactly one ready notification
    assert [x.decode() for x in await redis_client.lrange("af:sq:{env/s1}", 0, -1)] == [a.job_id, b.job_id]
    entries = await redis_client.xrange("af:ready")
    assert sorted(e[1][b"s"] for e in entries) == [b"env/s1", b"env/s2"]
    rec = await queue.get_job(a.job_id)
    assert rec is not None and rec.state == JobState.QUEUED and rec.payload == {"i": 0}
    assert await queue.queue_depth("env", "s1") == 2
    events = await redis_client.xrange("af:events")
    assert [e[1][b"state"] for e in events] == [b"queued"] * 3


async def test_batch_keeps_list_order_per_session(queue: Queue, redis_client: aioredis.Redis) -> None:
    results = await queue.enqueue_batch([job("s1", 0), job("s2", 0), job("s1", 1)])
    fifo = [x.decode() for x in await redis_client.lrange("af:sq:{env/s1}", 0, -1)]
    assert fifo == [results[0].job_id, results[2].job_id]


async def test_idempotency_same_request_same_job_different_request_conflict(queue: Queue) -> None:
    first = await queue.enqueue(job("s1", 0), idempotency_key="k")
    again = await queue.enqueue(job("s1", 0), idempotency_key="k")
    assert again == type(first)(first.job_id, False)
    with pytest.raises(IdempotencyConflict) as info:
        await queue.enqueue(job("s1", 99), idempotency_key="k")
    assert info.value.job_id == first.job_id
    assert await queue.queue_depth("env", "s1") == 1


async def test_explicit_fingerprint_decides_sameness(queue: Queue) -> None:
    first = await queue.enqueue(job("s1", 0), idempotency_key="k", fingerprint="f1")
    assert (await queue.enqueue(job("s1", 1), idempotency_key="k", fingerprint="f1")).job_id == first.job_id
    with pytest.raises(IdempotencyConflict):
        await queue.enqueue(job("s1", 0), idempotency_key="k", fingerprint="f2")


async def test_concurrent_duplicates_make_one_job(queue: Queue, redis_url: str, queue_config: object) -> None:
    # given 20 clients (own connections) racing the same keyed request
    clients = [RedisClient.from_url(redis_url) for _ in range(20)]
    try:
        queues = [Queue(c, queue.config) for c in clients]
        results = await asyncio.gather(*(q.enqueue(job("s1", 0), idempotency_key="dup") for q in queues))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    assert len({r.job_id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert await queue.queue_depth("env", "s1") == 1


async def test_batch_conflict_writes_nothing(queue: Queue) -> None:
    await queue.enqueue(job("s1", 0), idempotency_key="k")
    with pytest.raises(IdempotencyConflict):
        await queue.enqueue_batch([job("s2", 0), job("s1", 5)], idempotency_keys=[None, "k"])
    assert await queue.queue_depth("env", "s2") == 0


async def test_idempotency_is_per_principal(queue: Queue) -> None:
    a = await queue.enqueue(NewJob("env", "s1", JobKind.TOOL, {}, "alice"), idempotency_key="k")
    b = await queue.enqueue(NewJob("env", "s1", JobKind.TOOL, {}, "bob"), idempotency_key="k")
    assert a.job_id != b.job_id and b.created


async def test_cancel_queued_job_removes_it(queue: Queue, redis_client: aioredis.Redis) -> None:
    a = await queue.enqueue(job("s1", 0))
    b = await queue.enqueue(job("s1", 1))
    rec = await queue.cancel(b.job_id)
    assert rec is not None and rec.state == JobState.CANCELLED and rec.error is not None
    assert [x.decode() for x in await redis_client.lrange("af:sq:{env/s1}", 0, -1)] == [a.job_id]
    assert await redis_client.ttl(f"af:job:{b.job_id}") > 0
    assert await queue.cancel("nope") is None
    again = await queue.cancel(b.job_id)
    assert again is not None and again.state == JobState.CANCELLED


async def test_secrets_stay_out_of_the_record_and_events(queue: Queue, redis_client: aioredis.Redis) -> None:
    secret_job = NewJob("env", "s1", JobKind.TOOL, {"tool": "bash"}, "p", secrets={"TOKEN": "hunter2"})
    res = await queue.enqueue(secret_job)
    raw = await redis_client.hgetall(f"af:job:{res.job_id}")
    assert b"hunter2" not in b"".join(raw.values())
    assert all(b"hunter2" not in b"".join(f.values()) for _, f in await redis_client.xrange("af:events"))
    await queue.cancel(res.job_id)  # a terminal transition drops them
    assert not await redis_client.exists(f"af:sec:{res.job_id}")


async def test_sessions_listing_and_hash(queue: Queue) -> None:
    for n in range(5):
        await queue.enqueue(job(f"s{n}", 0))
    await queue.enqueue(job("x", 0, env="other"))
    page, cursor = await queue.list_sessions("env", count=3)
    assert page == ["s0", "s1", "s2"] and cursor == "s2"
    page, cursor = await queue.list_sessions("env", cursor, count=3)
    assert page == ["s3", "s4"] and cursor is None
    sess = await queue.get_session("env", "s0")
    assert sess is not None and sess["state"] == "new"
    assert await queue.get_session("env", "missing") is None


async def test_webhook_attempts_are_appended(queue: Queue) -> None:
    res = await queue.enqueue(job("s1", 0))
    assert await queue.record_webhook_attempt(res.job_id, {"status": 500, "at": 1.0}) == 1
    assert await queue.record_webhook_attempt(res.job_id, {"status": 200, "at": 2.0}) == 2
    rec = await queue.get_job(res.job_id)
    assert rec is not None and [a["status"] for a in rec.webhook_attempts] == [500, 200]
    assert await queue.record_webhook_attempt("gone", {}) == 0


async def test_read_output_of_job_without_output_ends(queue: Queue) -> None:
    res = await queue.enqueue(job("s1", 0))
    assert await queue.read_output(res.job_id) == []
    await queue.cancel(res.job_id)
    out = await queue.read_output(res.job_id)
    assert out[-1][1] == {"event": "end"}
    assert await queue.read_output("missing") == []


async def test_same_key_twice_in_one_batch_makes_one_job(queue: Queue) -> None:
    a, b = await queue.enqueue_batch([job("s1", 0), job("s1", 0)], idempotency_keys=["k", "k"])
    assert a.job_id == b.job_id and a.created and not b.created
    assert await queue.queue_depth("env", "s1") == 1


async def test_forget_session_only_when_idle(queue: Queue) -> None:
    res = await queue.enqueue(job("s1", 0))
    assert await queue.forget_session("env", "s1") is False
    await queue.cancel(res.job_id)
    assert await queue.forget_session("env", "s1") is True
    assert await queue.get_session("env", "s1") is None
    assert await queue.list_sessions("env") == ([], None)


async def test_concurrent_calls_batched_together_get_their_own_answers(queue: Queue) -> None:
    # 100 enqueues in one loop turn travel in a few pipelines; each caller must get its own job
    results = await asyncio.gather(*(queue.enqueue(job(f"b{n}", n)) for n in range(100)))
    for n, res in enumerate(results):
        rec = await queue.get_job(res.job_id)
        assert rec is not None and rec.session_id == f"b{n}" and rec.payload == {"i": n}
