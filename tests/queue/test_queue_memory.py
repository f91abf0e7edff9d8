"""Memory on real Redis: bytes per idle session with one finished job, and per queued job."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from queue_testkit import wait_for

from common.queue import Consumer, JobContext, JobKind, NewJob, Queue

SESSIONS = 1000
#: The per-session budget of ARCHITECTURE.md's data model (lists, small hashes).
IDLE_SESSION_BUDGET_BYTES = 1024


def tool_job(n: int) -> NewJob:
    payload = {"tool": "bash", "arguments": {"command": "ls -la"}}
    return NewJob("env", f"mem{n}", JobKind.TOOL, payload, "tester")


async def used(redis: aioredis.Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def test_bytes_per_idle_session_and_per_queued_job(
    redis_client: aioredis.Redis, queue: Queue
) -> None:
    await queue.load_scripts()
    base = await used(redis_client)

    async def handler(ctx: JobContext) -> dict[str, Any]:
        return {"exit_code": 0, "stdout": "", "stderr": ""}

    # given 1,000 sessions that each ran one job and are now idle
    await queue.enqueue_batch([tool_job(n) for n in range(SESSIONS)])
    consumer = Consumer(queue, "mem", handler, concurrency=64, block_ms=100)
    task = asyncio.create_task(consumer.run())

    async def drained() -> bool:
        return await redis_client.zcard("af:work") == 0

    await wait_for(drained, 30, "all jobs done")
    await consumer.stop()
    await task
    await redis_client.delete("af:events")  # fleet-wide stream, trimmed, not per session
    idle = (await used(redis_client) - base) / SESSIONS
    # when each gets one more job that stays queued
    before = await used(redis_client)
    await queue.enqueue_batch([tool_job(n) for n in range(SESSIONS)])
    await redis_client.delete("af:events", "af:ready")
    queued = (await used(redis_client) - before) / SESSIONS
    print(f"\nmemory: {idle:.0f} B per idle session (one finished job), {queued:.0f} B per queued job")
    assert idle <= IDLE_SESSION_BUDGET_BYTES
