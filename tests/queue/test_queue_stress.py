"""Stress on real Redis: 200 sessions x 50 jobs, 4 worker processes x concurrency 16.

Zero FIFO violations, zero overlapping executions within a session, every job terminal exactly once.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis
from queue_testkit import (
    WorkerFleet,
    check_session_log,
    enqueue_sessions,
    session_logs,
    terminal_event_counts,
    wait_for,
)

from common.queue import JobState, Queue

SESSIONS = 200
JOBS_PER_SESSION = 50
PROCESSES = 4
CONCURRENCY = 16


@pytest.mark.slow
async def test_stress_fifo_no_overlap_exactly_once(
    queue: Queue, redis_client: aioredis.Redis, redis_url: str
) -> None:
    fleet = WorkerFleet(redis_url, concurrency=CONCURRENCY, lease_ttl_s=2.0, max_job_ms=2.0)
    try:
        # given 10,000 jobs already queued, then 4 worker processes
        order = await enqueue_sessions(queue, SESSIONS, JOBS_PER_SESSION)
        total = SESSIONS * JOBS_PER_SESSION
        started = time.monotonic()
        for _ in range(PROCESSES):
            fleet.start()

        async def drained() -> bool:
            return await redis_client.zcard("af:work") == 0 and await redis_client.xlen("af:ready") == 0

        await wait_for(drained, 120, "every FIFO to drain", every_s=0.1)
        elapsed = time.monotonic() - started
        print(f"\nstress: {total} jobs in {elapsed:.1f} s = {total / elapsed:.0f} jobs/s")
    finally:
        fleet.stop_all()

    # then every job succeeded, exactly one terminal event each
    counts = await terminal_event_counts(redis_client)
    all_ids = [jid for ids in order.values() for jid in ids]
    assert len(counts) == total and all(counts[j] == 1 for j in all_ids)
    pipe = redis_client.pipeline(transaction=False)
    for jid in all_ids:
        pipe.hget(f"af:job:{jid}", "st")
    assert set(await pipe.execute()) == {JobState.SUCCEEDED.value.encode()}
    # and each session ran its jobs in order, one at a time, each exactly once
    logs = await session_logs(redis_client, list(order))
    problems = {s: p for s in order if (p := check_session_log(logs[s], order[s], killed=set()))}
    assert problems == {}
    assert all(len(logs[s]) == 2 * JOBS_PER_SESSION for s in order)
