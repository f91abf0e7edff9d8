"""Reads of `ready` on real Redis: each blocking reader has a connection of its own, so a read
blocked in Redis holds up neither the queue's script calls nor another reader."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from queue_testkit import job, wait_for

from common.queue import Consumer, JobContext, Queue


async def blocked_clients(redis: aioredis.Redis) -> int:
    return int((await redis.info("clients"))["blocked_clients"])


async def test_a_blocked_read_does_not_hold_up_script_calls(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given a read of `ready` blocked in Redis (nothing to read yet)
    await queue.ensure_group()
    before = await blocked_clients(redis_client)
    read = asyncio.create_task(queue.read_ready("w", 10, 10_000))

    async def read_is_blocked() -> bool:
        return await blocked_clients(redis_client) == before + 1

    await wait_for(read_is_blocked, 5, "the read to block in Redis")
    # when a job is enqueued meanwhile (a script call of the same queue)
    await queue.enqueue(job("s", 0))
    # then the enqueue went through at once and woke the read: behind the read on one connection,
    # it would have waited for the read to time out empty
    [(_, session)] = await asyncio.wait_for(read, 5)
    assert session == "env/s"


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
        await wait_for(both_blocked, 5, "both consumers blocked in a read of `ready`")
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))
        await asyncio.gather(*runs)


async def test_a_read_recreates_a_lost_group(queue: Queue, redis_client: aioredis.Redis) -> None:
    # given Redis lost the `ready` stream and its group (flushed, or restarted without data)
    await queue.ensure_group()
    await redis_client.delete(queue.keys.ready)
    # when a worker reads: nothing, and the group is back
    assert await queue.read_ready("w", 10, 100) == []
    # then the next notification reaches the next read
    await queue.enqueue(job("s", 0))
    [(_, session)] = await queue.read_ready("w", 10, 1000)
    assert session == "env/s"
