"""Direct handoff on real Redis: a session that becomes ready goes straight to a worker with a
free slot announced (lease and head job included), else it waits in `ready` for `take_work`; a
worker's blocking inbox read has a connection of its own; retired and dead workers' sessions are
handed on."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from queue_testkit import job, wait_for

from common.queue import Consumer, JobContext, JobState, Queue


async def blocked_clients(redis: aioredis.Redis) -> int:
    return int((await redis.info("clients"))["blocked_clients"])


async def ready_sessions(redis: aioredis.Redis) -> list[bytes]:
    return [fields[b"s"] for _, fields in await redis.xrange("af:ready")]


async def test_a_session_goes_to_the_idle_worker_with_its_lease_and_head_job(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given a worker that announced two free slots and waits on its inbox (blocked in Redis)
    assert await queue.take_work("w", 2, announce_s=5) == []
    before = await blocked_clients(redis_client)
    read = asyncio.create_task(queue.wait_handoffs("w", 10))

    async def read_is_blocked() -> bool:
        return await blocked_clients(redis_client) == before + 1

    await wait_for(read_is_blocked, 5, "the inbox read to block in Redis")
    # when a job is enqueued (a script call of the same queue, not held up by the blocked read)
    res = await queue.enqueue(job("s", 0))
    # then the read returns the session, its lease already taken and its job running
    [handoff] = await asyncio.wait_for(read, 5)
    assert handoff.job.id == res.job_id and handoff.job.state == JobState.RUNNING
    assert handoff.lease.worker_id == "w" and handoff.lease.session == "env/s"
    assert await redis_client.get("af:lease:{env/s}") == handoff.lease.value.encode()
    assert await ready_sessions(redis_client) == []
    assert await redis_client.zscore("af:idle", "w") == 1  # one slot left
    # and its completion is fenced by that lease as usual
    assert await queue.complete(handoff.lease, res.job_id, JobState.SUCCEEDED, result={}) is None


async def test_sessions_wait_in_ready_once_announced_slots_are_used(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    assert await queue.take_work("w", 1, announce_s=5) == []
    await queue.enqueue(job("a", 0))  # handed to w: its only slot
    await queue.enqueue(job("b", 0))
    assert await redis_client.zscore("af:idle", "w") is None
    assert await ready_sessions(redis_client) == [b"env/b"]
    # a worker with a free slot takes what waits in `ready` before it announces anything
    [taken] = await queue.take_work("v", 3, announce_s=5)
    assert taken.lease.session == "env/b"
    assert await ready_sessions(redis_client) == []
    assert await redis_client.zscore("af:idle", "v") == 2
    [handed] = await queue.wait_handoffs("w", 1)
    assert handed.lease.session == "env/a"


async def test_the_worker_with_most_free_slots_gets_the_session(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    await queue.take_work("small", 1, announce_s=5)
    await queue.take_work("big", 3, announce_s=5)
    for n in range(3):
        await queue.enqueue(job(f"s{n}", 0))
    # big (3 free) gets two, until it has as few free as small; then the tie goes either way
    assert await redis_client.llen("af:inbox:big") >= 2
    assert await redis_client.llen("af:inbox:big") + await redis_client.llen("af:inbox:small") == 3


async def test_a_lapsed_announcement_gets_nothing_and_is_renewed_afresh(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given a worker whose announcement lapsed (it stopped renewing it: dead or stalled)
    await queue.take_work("w", 4, announce_s=0.001)
    await asyncio.sleep(0.01)
    # then a session that becomes ready is not handed to it
    await queue.enqueue(job("s", 0))
    assert await ready_sessions(redis_client) == [b"env/s"]
    assert await redis_client.llen("af:inbox:w") == 0
    # and when it renews, its free slots count from its own figure, not the stale one
    [taken] = await queue.take_work("w", 0, announce_s=5, free=2)
    assert taken.lease.session == "env/s"
    assert await redis_client.zscore("af:idle", "w") == 1


async def test_retire_hands_on_what_the_inbox_holds_and_wakes_the_reader(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    await queue.take_work("leaving", 2, announce_s=5)
    res = await queue.enqueue(job("s", 0))
    assert await redis_client.llen("af:inbox:leaving") == 1
    await queue.take_work("staying", 2, announce_s=5)
    # when the first worker retires before taking the session from its inbox
    assert await queue.retire("leaving") == 1
    # then the session was handed on to the other idle worker, and the leaving reader wakes empty
    [handoff] = await queue.wait_handoffs("staying", 1)
    assert handoff.job.id == res.job_id and handoff.lease.worker_id == "staying"
    assert await queue.wait_handoffs("leaving", 1) == []
    assert await redis_client.zscore("af:idle", "leaving") is None


async def test_a_dead_workers_inbox_is_handed_on_by_repair(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given a worker that was handed a session and died before taking it
    await queue.take_work("dead", 2, announce_s=0.5)
    res = await queue.enqueue(job("s", 0))
    assert await queue.forget_dead_workers() == 0  # its announcement still runs
    await asyncio.sleep(0.55)
    # then repair forgets it and releases the session at once (no wait for its lease to expire)
    assert (await queue.repair())["dead_workers"] == 1
    assert await redis_client.hlen("af:idle_until") == 0
    assert not await redis_client.exists("af:inbox:dead")
    [again] = await queue.take_work("alive", 1)
    assert again.job.id == res.job_id


async def test_consumers_of_one_queue_block_in_their_own_reads(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        return {}

    # given two consumers of the same Queue object, idle
    before = await blocked_clients(redis_client)
    consumers = [Consumer(queue, f"w{n}", handler, block_ms=1000, stop_grace_s=1.0) for n in range(2)]
    runs = [asyncio.create_task(c.run()) for c in consumers]

    async def both_blocked() -> bool:
        return await blocked_clients(redis_client) == before + 2

    try:
        # then both wait in Redis at the same time (one shared connection would let one at a time)
        await wait_for(both_blocked, 5, "both consumers blocked in a read of their inbox")
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))
        await asyncio.gather(*runs)
    # and stopping withdrew both announcements
    assert await redis_client.zcard("af:idle") == 0


async def test_a_restarted_worker_hands_on_what_its_predecessor_was_given(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given sessions handed to worker "w" whose process died before taking them
    await queue.take_work("w", 2, announce_s=60)
    ids = [(await queue.enqueue(job(f"s{n}", 0))).job_id for n in range(2)]
    assert await redis_client.llen("af:inbox:w") == 2
    done: list[str] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        done.append(ctx.job.id)
        return {}

    # when a new process starts under the same id, the sessions run: no repair pass runs here,
    # so without the start-up retire their leases would expire and nothing would hand them on
    consumer = Consumer(queue, "w", handler, block_ms=100, stop_grace_s=1.0)
    run = asyncio.create_task(consumer.run())
    try:
        async def both_done() -> bool:
            return sorted(done) == sorted(ids)

        await wait_for(both_done, 5, "the predecessor's sessions to run")
    finally:
        await consumer.stop()
        await run
