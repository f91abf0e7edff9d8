"""Retention on real Redis: small output folded into the record, long output streamed and kept
only `jobs.output_ttl_s`, caps on output and results, and a compact finished record."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from common.config import Config, parse_config
from common.queue import Consumer, JobContext, JobKind, JobState, NewJob, Queue
from common.queue.output import OUTPUT_MARKER, RESULT_MARKER
from common.queue.waiter import JobWaiter

OUTPUT_TTL_S = 30.0
HOLD_S = 0.2
CAP = 2048


@pytest.fixture
def queue_config() -> Config:
    return parse_config({
        "workers": {"lease_ttl_s": 1.0},
        "jobs": {"output_ttl_s": OUTPUT_TTL_S, "output_hold_s": HOLD_S, "output_fold_max_bytes": 256,
                 "output_max_bytes": CAP, "result_max_bytes": CAP},
    })


Handler = Any


async def run_one(queue: Queue, handler: Handler, payload: dict[str, Any] | None = None) -> str:
    """Enqueue one job, run it with a Consumer, and return its id once it ended."""
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, payload or {"name": "bash"}, "p"))
    consumer = Consumer(queue, "w", handler, block_ms=100)
    task = asyncio.create_task(consumer.run())
    waiter = JobWaiter(queue)
    try:
        done = await waiter.wait(res.job_id, 10)
        assert done is not None and done.state == JobState.SUCCEEDED
    finally:
        await waiter.close()
        await consumer.stop()
        await task
    return res.job_id


async def test_small_quick_output_is_folded_into_a_compact_record(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        await ctx.append_output("stdout", "hello\n")
        await ctx.append_output("stderr", "warn\n")
        return {"output": "hello\n"}

    # given a job that prints two short lines and ends at once
    jid = await run_one(queue, handler)
    # then no stream was kept: the output is in the record, which lost its payload
    assert not await redis_client.exists(f"af:out:{jid}")
    fields = await redis_client.hgetall(f"af:job:{jid}")
    assert b"o" in fields and b"pl" not in fields
    assert await redis_client.object("encoding", f"af:job:{jid}") in (b"ziplist", b"listpack")  # 6.2, 7.x
    assert 0 < await redis_client.pttl(f"af:job:{jid}") <= queue.config.jobs.ttl_s * 1000
    # and readers see the same entries a stream would give, resumable by id
    out = await queue.read_output(jid)
    assert [e[1] for e in out] == [{"stream": "stdout", "data": "hello\n"},
                                   {"stream": "stderr", "data": "warn\n"}, {"event": "end"}]
    assert await queue.read_output(jid, after=out[0][0]) == out[1:]
    assert await queue.read_output(jid, after=out[-1][0]) == []


async def test_output_of_a_longer_job_streams_as_it_comes_and_expires_early(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    seen_while_running: list[list[Any]] = []

    async def handler(ctx: JobContext) -> dict[str, Any]:
        await ctx.append_output("stdout", "tick1\n")
        await asyncio.sleep(HOLD_S * 3)
        seen_while_running.append(await ctx.queue.read_output(ctx.job.id))
        await ctx.append_output("stdout", "tick2\n")
        return {}

    jid = await run_one(queue, handler)
    # then the first line was readable while the job still ran
    assert [e[1]["data"] for e in seen_while_running[0]] == ["tick1\n"]
    out = await queue.read_output(jid)
    assert [e[1].get("data") for e in out] == ["tick1\n", "tick2\n", None]
    # and the stream lives only as long as a reader may still stream it
    assert 0 < await redis_client.pttl(f"af:out:{jid}") <= OUTPUT_TTL_S * 1000
    assert b"o" not in await redis_client.hgetall(f"af:job:{jid}")


async def test_a_reader_blocked_on_a_job_gets_its_folded_output(queue: Queue) -> None:
    started = asyncio.Event()

    async def handler(ctx: JobContext) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(0.3)  # the reader blocks meanwhile
        await ctx.append_output("stdout", "late\n")
        return {}

    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p"))
    consumer = Consumer(queue, "w", handler, block_ms=100)
    task = asyncio.create_task(consumer.run())
    try:
        await started.wait()
        got: list[Any] = []
        after = "0-0"
        while not got or got[-1][1].get("event") != "end":
            batch = await queue.read_output(res.job_id, after=after, block_ms=5000)
            got += batch
            after = batch[-1][0] if batch else after
    finally:
        await consumer.stop()
        await task
    assert [e[1].get("data") for e in got] == ["late\n", None]


async def test_output_past_the_cap_is_cut_with_a_marker_and_the_job_says_so(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        for _ in range(10):  # 10 x 1000 bytes against a 2048-byte cap
            await ctx.append_output("stdout", "x" * 999 + "\n")
        return {"output": "ok"}

    jid = await run_one(queue, handler)
    data = "".join(e[1].get("data", "") for e in await queue.read_output(jid))
    marker = OUTPUT_MARKER.format(limit=CAP)
    assert data.endswith(marker) and len(data.encode()) == CAP + len(marker)
    job = await queue.get_job(jid)
    assert job is not None and job.state == JobState.SUCCEEDED and job.truncated == ("output",)


async def test_a_result_past_the_cap_is_cut_and_the_job_still_succeeds(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        return {"type": "function_call_output", "output": "é" * 5000, "is_error": False}

    jid = await run_one(queue, handler)
    job = await queue.get_job(jid)
    assert job is not None and job.state == JobState.SUCCEEDED and job.truncated == ("result",)
    assert job.result is not None and job.result["type"] == "function_call_output"
    assert job.result["output"].endswith(RESULT_MARKER.format(limit=CAP))
    assert len(await queue.redis.hget(f"af:job:{jid}", "res")) <= CAP  # type: ignore[misc]
