"""A full Redis (maxmemory, noeviction) on the real queue: writes refused whole, nothing
half-written, running jobs still finish, and everything works again once memory frees."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError

from common.queue import JobKind, JobState, NewJob, Queue, RedisFull

BALLAST = "t:ballast:"


@pytest.fixture
async def full(redis_client: aioredis.Redis) -> AsyncIterator[Any]:
    """Fills Redis to a maxmemory just above what it holds (the shared test server gets its
    setting back afterwards); `.free()` drops the ballast."""

    class Full:
        async def fill(self) -> None:
            # 2 MiB of ballast in small writes, then a cap 1 MiB below what Redis holds, as its
            # own check counts it (used_memory less mem_not_counted_for_evict: the AOF buffers,
            # which a background rewrite on a slow host keeps large): every first write is
            # refused. used_memory also counts client buffers and what an earlier test's
            # connections held, which Redis frees in the background a moment later: a cap a
            # write got past is measured and set again.
            self.keys = 512
            for start in range(0, self.keys, 16):
                await redis_client.mset({f"{BALLAST}{i}": "x" * 4096 for i in range(start, start + 16)})
            for _ in range(5):
                memory = await redis_client.info("memory")
                used = int(memory["used_memory"]) - int(memory.get("mem_not_counted_for_evict", 0))
                await redis_client.config_set("maxmemory", used - 1024 * 1024)
                try:
                    await redis_client.set(f"{BALLAST}probe", "x")
                except OutOfMemoryError:
                    return
                await redis_client.delete(f"{BALLAST}probe")
            pytest.fail("Redis took writes past a cap 1 MiB below its used_memory, five times")

        async def free(self) -> None:
            await redis_client.delete(*(f"{BALLAST}{i}" for i in range(self.keys)))

    before = (await redis_client.config_get("maxmemory"))["maxmemory"]
    state = Full()
    try:
        yield state
    finally:
        await redis_client.config_set("maxmemory", before)


async def test_a_full_redis_refuses_enqueues_whole_and_running_jobs_still_finish(
    queue: Queue, redis_client: aioredis.Redis, full: Any
) -> None:
    # given a running job, then Redis at its maxmemory
    first = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p", secrets={"K": "v"}))
    [handoff] = await queue.take_work("w", 1)
    await full.fill()
    filled = await redis_client.dbsize()
    # when a batch is enqueued: refused, and nothing of it was written
    with pytest.raises(RedisFull):
        await queue.enqueue_batch([NewJob("env", f"n{i}", JobKind.TOOL, {}, "p") for i in range(3)])
    assert await redis_client.dbsize() == filled
    assert await redis_client.llen("af:sq:{env/n0}") == 0
    # then the running job still finishes whole (its first write frees memory), secrets gone
    await queue.complete(handoff.lease, first.job_id, JobState.SUCCEEDED, result={"ok": True},
                         output='["stdout","hi\\n"]')
    done = await queue.get_job(first.job_id)
    assert done is not None and done.state == JobState.SUCCEEDED and done.result == {"ok": True}
    assert [e[1].get("data") for e in await queue.read_output(first.job_id)] == ["hi\n", None]
    assert not await redis_client.exists(f"af:sec:{first.job_id}")
    # and once memory frees, enqueues are accepted again
    await full.free()
    again = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p"))
    assert again.created and await redis_client.llen("af:sq:{env/s}") == 1


async def test_a_full_redis_refuses_a_cancel_request_without_writing(
    queue: Queue, redis_client: aioredis.Redis, full: Any
) -> None:
    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {}, "p"))
    await queue.take_work("w", 1)  # running: a cancel request is a flag (the first write)
    await full.fill()
    with pytest.raises(RedisFull):
        await queue.cancel(res.job_id)
    assert await redis_client.hget(f"af:job:{res.job_id}", "cx") is None
    await full.free()
