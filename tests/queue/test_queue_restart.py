"""Redis restart on real Redis: kill -9 mid-run (AOF, appendfsync everysec), restart on the same
port and data dir. Acknowledged jobs (enqueue returned) are not lost and keep their order; worker
processes reconnect by themselves.

A SIGKILLed redis-server loses nothing it already wrote to the AOF file: the kernel keeps the
page cache. `everysec` only risks the last second on a machine crash, which this test does not do.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from queue_testkit import WorkerFleet, job, run_repairs, session_logs, wait_for
from redis.exceptions import RedisError

from common.config import Config
from common.embedded_redis import EmbeddedRedis, start_embedded_redis
from common.queue import JobState, Queue
from common.redis.client import RedisClient

SESSIONS = 40


async def enqueue_until(queue: Queue, stop: asyncio.Event, acked: dict[str, list[str]]) -> int:
    """Enqueue round-robin until stopped; record only acknowledged jobs. Returns failed attempts."""
    failures, n = 0, 0
    while not stop.is_set():
        session = f"s{n % SESSIONS}"
        try:
            res = await queue.enqueue(job(session, n))
        except (RedisError, OSError):
            failures += 1  # not acknowledged: it may or may not exist
            await asyncio.sleep(0.05)
            continue
        acked[session].append(res.job_id)
        n += 1
        await asyncio.sleep(0.002)
    return failures


@pytest.mark.slow
async def test_acknowledged_jobs_survive_redis_kill_and_workers_reconnect(
    tmp_path: Path, queue_config: Config
) -> None:
    server: EmbeddedRedis = start_embedded_redis(tmp_path / "redis")
    client = aioredis.Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=1)
    timeouts = "socket_timeout=5&socket_connect_timeout=1"
    queue = Queue(RedisClient.from_url(f"{server.url}?{timeouts}"), queue_config)
    await queue.load_scripts()
    fleet = WorkerFleet(server.url, concurrency=8, lease_ttl_s=1.0, max_job_ms=2.0)
    acked: dict[str, list[str]] = {f"s{n}": [] for n in range(SESSIONS)}
    stop_enqueue, stop_repairs = asyncio.Event(), asyncio.Event()
    repairs = asyncio.create_task(run_repairs(queue, 0.2, stop_repairs))
    try:
        workers = [fleet.start() for _ in range(2)]
        await fleet.wait_working(client, workers)
        enqueuer = asyncio.create_task(enqueue_until(queue, stop_enqueue, acked))
        await asyncio.sleep(1.0)  # let work flow before the crash (what is measured is the crash)
        # when Redis is killed mid-run and comes back on the same port and data dir
        server.kill()
        killed_at = time.monotonic()
        acked_at_kill = sum(len(v) for v in acked.values())
        await asyncio.sleep(0.5)
        server = start_embedded_redis(tmp_path / "redis", port=server.port)
        down_s = time.monotonic() - killed_at
        print(f"\nredis down for {down_s:.2f} s; {acked_at_kill} jobs acknowledged before")
        await asyncio.sleep(1.0)
        stop_enqueue.set()
        failures = await enqueuer
        all_acked = [jid for ids in acked.values() for jid in ids]

        async def all_terminal() -> bool:
            pipe = client.pipeline(transaction=False)
            for jid in all_acked:
                pipe.hget(f"af:job:{jid}", "st")
            states = await pipe.execute()
            missing = [j for j, st in zip(all_acked, states, strict=True) if st is None]
            assert not missing, f"acknowledged jobs lost: {missing[:5]}"
            return set(states) == {JobState.SUCCEEDED.value.encode()}

        await wait_for(all_terminal, 60, "every acknowledged job to succeed", every_s=0.2)
        print(f"{len(all_acked)} acknowledged jobs all succeeded "
              f"({failures} enqueue attempts failed while down)")
        # then the same worker processes did the work after the restart: they reconnected
        assert all(w.proc.poll() is None for w in workers)
        logs = await session_logs(client, list(acked))
        for s, ids in acked.items():
            started = list(dict.fromkeys(e.job_id for e in logs[s] if e.kind == "S" and e.job_id in set(ids)))
            assert started == ids, f"order broken in {s}"
    finally:
        stop_enqueue.set()
        stop_repairs.set()
        await repairs
        fleet.stop_all()
        await queue.redis.aclose()
        await client.aclose()
        server.stop()
