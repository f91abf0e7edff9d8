"""Reconciler benchmark: one full pass over 10,000 sessions, and Redis memory per idle session.

How the sessions are made: 10,000 `resume` jobs are enqueued through the real queue
(`Queue.enqueue_batch`) and run by a real `Consumer` whose handler only records what a worker's
resume/suspend would (`state`, `actor`, `last_activity`, ... via the fenced `update_session`), so
no real actors are needed for the Redis side: all but four end suspended; of those four, two run
and are active, one runs idle for an hour (the idle pass enqueues its `suspend_if_idle` job) and
one runs in Redis while the local Substrate holds its actor SUSPENDED (a "memory lost" drift the
pass repairs). The local Substrate holds a handful of actors: those four and one orphan.

The full pass is what the leader runs each period plus the status sync: queue repair, idle, and
status sync (survey all sessions, ListActors, compare, repair). Memory per idle session is the
`used_memory` growth once the sessions' finished job records are gone (their TTL emulated by
deleting them), divided by the number of sessions; a sampled `MEMORY USAGE` of session hashes is
printed next to it.

Run: `.venv/bin/python bench/reconciler.py [--sessions N]`. The last line is one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/queue.py would shadow the
# stdlib `queue` module that redis imports: swap it for the repository root.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import redis.asyncio as aioredis  # noqa: E402

from common.actor_names import actor_name  # noqa: E402
from common.config import Config, parse_config  # noqa: E402
from common.embedded_redis import start_embedded_redis  # noqa: E402
from common.queue import Consumer, JobContext, JobKind, NewJob, Queue  # noqa: E402
from common.redis.client import RedisClient  # noqa: E402
from common.substrate import SubstrateClient, make_substrate_client  # noqa: E402
from local_substrate.server import LocalSubstrate  # noqa: E402
from reconciler.service import Reconciler  # noqa: E402

ENV = "bench-env"
ATESPACE = "default"
TEMPLATE = "default-env-template"
ENQUEUE_BATCH = 1000
#: Session hashes sampled with MEMORY USAGE.
SAMPLE = 200


#: Sessions that end running (the rest end suspended): two active, one idle for an hour, and one
#: whose actor the local Substrate holds SUSPENDED ("memory lost").
RUNNING = {"s1": "running", "s2": "running", "s3": "idle", "s4": "running"}
#: s4's actor exists but stays suspended; the others run.
LOST = "s4"


def plan(i: int) -> str:
    return RUNNING.get(f"s{i}", "suspended")


async def handler(ctx: JobContext) -> dict[str, Any]:
    """What a worker records for a resume (running) or a resume and later suspend (suspended)."""
    i = int(ctx.job.session_id.removeprefix("s"))
    kind = plan(i)
    now = time.time()
    last = now - 3600 if kind == "idle" else now
    await ctx.update_session(state="suspended" if kind == "suspended" else "running",
                             actor=actor_name(ENV, ctx.job.session_id), resumed="1", cold_start="1",
                             last_resume_ms="250.0", last_activity=f"{last:.6f}")
    return {"status": "ok"}


async def make_sessions(queue: Queue, n: int) -> float:
    """Enqueue one resume job per session and run them all through a Consumer; seconds taken."""
    started = time.perf_counter()
    done = asyncio.Event()
    count = 0

    async def counting(ctx: JobContext) -> dict[str, Any]:
        nonlocal count
        result = await handler(ctx)
        count += 1
        if count == n:
            done.set()
        return result

    consumer = Consumer(queue, "bench-worker", counting, concurrency=256, block_ms=100)
    run = asyncio.create_task(consumer.run())
    for lo in range(0, n, ENQUEUE_BATCH):
        ids = range(lo, min(n, lo + ENQUEUE_BATCH))
        jobs = [NewJob(ENV, f"s{i}", JobKind.RESUME, {}, "bench") for i in ids]
        await queue.enqueue_batch(jobs)
    await done.wait()
    await consumer.stop()
    await run
    return time.perf_counter() - started


async def make_actors(client: SubstrateClient, queue: Queue) -> None:
    """A handful of actors: the running sessions' (one of them suspended: a drift), one orphan."""
    await client.ensure_atespace(ATESPACE)
    for sid in RUNNING:
        name = actor_name(ENV, sid)
        await client.ensure_actor(ATESPACE, name, TEMPLATE)
        if sid != LOST:
            await client.resume_actor(ATESPACE, name)
    await client.ensure_actor(ATESPACE, actor_name(ENV, "no-such-session"), TEMPLATE)


async def used_memory(redis: aioredis.Redis) -> int:
    """Dataset memory: other connections are closed first, so client buffers do not count."""
    await redis.connection_pool.disconnect()
    return int((await redis.info("memory"))["used_memory"])


async def forget_finished_jobs(redis: aioredis.Redis, queue: Queue) -> None:
    """Emulate the job TTL running out: job records and output streams gone, events trimmed."""
    for pattern in (queue.keys.job("*"), queue.keys.output("*")):
        async for batch in _scan_batches(redis, pattern):
            await redis.unlink(*batch)
    await redis.xtrim(queue.keys.events, maxlen=0, approximate=False)


async def _scan_batches(redis: aioredis.Redis, pattern: str) -> Any:
    batch: list[bytes] = []
    async for key in redis.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            yield batch
            batch = []
    if batch:
        yield batch


async def sampled_session_bytes(redis: aioredis.Redis, queue: Queue, n: int) -> float:
    picks = random.Random(1).sample(range(n), min(SAMPLE, n))
    sizes = [await redis.memory_usage(queue.keys.session(f"{ENV}/s{i}")) or 0 for i in picks]
    return sum(sizes) / len(sizes)


def bench_config(redis_url: str, state_dir: Path) -> Config:
    return parse_config({
        "state_dir": str(state_dir),
        "redis": {"url": redis_url},
        "environments": [{"name": ENV, "idle_timeout_s": 600, "atespace": ATESPACE, "template": TEMPLATE}],
        "local_substrate": {"slots": 4, "stop_grace_s": 1},
    })


async def run(n: int) -> dict[str, Any]:
    state_dir = Path(tempfile.mkdtemp(prefix="rbench-", dir="/tmp"))
    server_redis = start_embedded_redis(state_dir / "redis")
    config = bench_config(server_redis.url, state_dir)
    redis = aioredis.Redis.from_url(server_redis.url)
    substrate = LocalSubstrate(config, "127.0.0.1:0")
    await substrate.start()
    client = make_substrate_client(config, substrate.address)
    fleet_redis = RedisClient.from_url(server_redis.url)
    try:
        queue = Queue(fleet_redis, config)
        await make_actors(client, queue)
        base = await used_memory(redis)
        create_s = await make_sessions(queue, n)
        with_jobs = await used_memory(redis)
        await forget_finished_jobs(redis, queue)
        idle_mem = await used_memory(redis)
        reconciler = Reconciler(config, fleet_redis, client, "bench")
        assert await reconciler.leader.wait_until_leader(asyncio.Event())
        passes = await reconciler.full_pass()
        full_pass_s = sum(p.duration_s for p in passes)
        warm = await reconciler.full_pass()
        return {
            "sessions": n,
            "sessions_made_by": "queue enqueue_batch + Consumer with a handler that records session state",
            "create_sessions_s": round(create_s, 2),
            "full_pass_s": round(full_pass_s, 3),
            "full_pass_warm_s": round(sum(p.duration_s for p in warm), 3),
            **{f"{p.name}_s": round(p.duration_s, 3) for p in passes},
            "repairs": {p.name: {str(k): v for k, v in p.repairs.items()} for p in passes if p.repairs},
            "redis_bytes_per_idle_session": round((idle_mem - base) / n, 1),
            "redis_bytes_per_session_with_finished_job": round((with_jobs - base) / n, 1),
            "session_hash_bytes_sampled": round(await sampled_session_bytes(redis, queue, n), 1),
        }
    finally:
        await client.close()
        await substrate.stop(suspend_running=False)
        await redis.aclose()
        await fleet_redis.aclose()
        server_redis.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    figures = asyncio.run(run(args.sessions))
    print(f"sessions:                        {figures['sessions']} ({figures['sessions_made_by']})")
    print(f"made in:                         {figures['create_sessions_s']} s")
    print(f"full pass (queue repair + idle + status sync): {figures['full_pass_s']} s "
          f"(target <= 2 s); warm: {figures['full_pass_warm_s']} s")
    print(f"  queue_repair {figures['queue_repair_s']} s, idle {figures['idle_s']} s, "
          f"status_sync {figures['status_sync_s']} s")
    print(f"repairs:                         {figures['repairs']}")
    print(f"redis bytes per idle session:    {figures['redis_bytes_per_idle_session']} (target <= 1024)")
    print(f"  with its finished job record:  {figures['redis_bytes_per_session_with_finished_job']}")
    print(f"  session hash (MEMORY USAGE):   {figures['session_hash_bytes_sampled']}")
    print(json.dumps(figures, separators=(",", ":")))


if __name__ == "__main__":
    main()
