"""Benchmark of the per-session FIFO queue against arq, on one embedded Redis (loopback).

Figures: no-op jobs/s end to end (enqueue -> complete) over 1,000 sessions with 1 and 2 worker
processes; enqueue->start latency p50/p99 with idle workers; the same no-op workload through arq
(same worker processes, max_jobs = our concurrency, poll_delay 50 ms) and the ratio; Redis bytes
per idle session (one finished job) and per queued job. Run: `.venv/bin/python bench/queue.py`.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the stdlib `queue` module (the issue fixes the name): drop its directory
# from the import path before anything imports `queue` (asyncio and redis do).
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import redis.asyncio as aioredis  # noqa: E402

from common.config import parse_config  # noqa: E402
from common.embedded_redis import start_embedded_redis  # noqa: E402
from common.queue import Consumer, JobContext, JobKind, JobWaiter, NewJob, Queue  # noqa: E402

SESSIONS = 1000
JOBS_PER_SESSION = 20
CONCURRENCY = 64
LATENCY_SAMPLES = 500
ARQ_QUEUE = "arq:queue"


def config() -> Any:
    return parse_config({"workers": {"lease_ttl_s": 10, "jobs_per_turn": 8}})


# -- worker processes ----------------------------------------------------------------------------
async def our_worker(url: str, worker_id: str) -> None:
    redis = aioredis.Redis.from_url(url)
    queue = Queue(redis, config())

    async def noop(ctx: JobContext) -> dict[str, Any]:
        return {"t": time.time()} if ctx.job.payload.get("lat") else {}

    consumer = Consumer(queue, worker_id, noop, concurrency=CONCURRENCY, block_ms=1000)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(consumer.stop()))
    await consumer.run()


async def arq_noop(ctx: dict[str, Any]) -> None:
    return None


def arq_worker(url: str) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker

    worker = Worker(functions=[arq_noop], redis_settings=RedisSettings.from_dsn(url), max_jobs=CONCURRENCY,
                    poll_delay=0.05, keep_result=0, handle_signals=True)
    worker.run()


def spawn(kind: str, url: str, n: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, __file__, "--worker", kind, "--url", url, "--id", f"{kind}{i}"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(n)
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- measurements --------------------------------------------------------------------------------
async def wait_until(cond: Any, timeout_s: float = 300.0, every_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not await cond():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(every_s)


async def ours_throughput(redis: aioredis.Redis, url: str, workers: int) -> float:
    await redis.flushall()
    queue = Queue(redis, config())
    await queue.load_scripts()
    procs = spawn("ours", url, workers)
    try:
        await wait_until(lambda: _consumers_ready(redis, workers))
        started = time.perf_counter()
        for i in range(JOBS_PER_SESSION):
            await queue.enqueue_batch(
                [NewJob("bench", f"s{n}", JobKind.TOOL, {"i": i}, "bench") for n in range(SESSIONS)]
            )
        await wait_until(lambda: _zero(redis.zcard("af:work")))
        elapsed = time.perf_counter() - started
    finally:
        stop(procs)
    return SESSIONS * JOBS_PER_SESSION / elapsed


async def _consumers_ready(redis: aioredis.Redis, n: int) -> bool:
    """n worker processes are blocked reading their inbox, with their free slots announced."""
    clients = await redis.client_list()
    return sum(1 for c in clients if c.get("cmd") == "blpop") >= n


async def _zero(value: Any) -> bool:
    return int(await value) == 0


async def ours_latency(redis: aioredis.Redis, url: str) -> tuple[float, float]:
    await redis.flushall()
    queue = Queue(redis, config())
    await queue.load_scripts()
    procs = spawn("ours", url, 1)
    waiter = JobWaiter(queue)
    samples: list[float] = []
    try:
        await wait_until(lambda: _consumers_ready(redis, 1))
        for n in range(LATENCY_SAMPLES):
            before = time.time()
            res = await queue.enqueue(NewJob("bench", f"lat{n}", JobKind.TOOL, {"lat": 1}, "bench"))
            rec = await waiter.wait(res.job_id, 10)
            assert rec is not None and rec.result is not None
            samples.append((rec.result["t"] - before) * 1000)
    finally:
        await waiter.close()
        stop(procs)
    q = statistics.quantiles(samples, n=100)
    return statistics.median(samples), q[98]


async def arq_throughput(redis: aioredis.Redis, url: str, workers: int) -> float:
    from arq.connections import RedisSettings, create_pool

    await redis.flushall()
    pool = await create_pool(RedisSettings.from_dsn(url))
    procs = spawn("arq", url, workers)
    try:
        await wait_until(lambda: _arq_ready(redis, workers))
        total = SESSIONS * JOBS_PER_SESSION
        started = time.perf_counter()
        for chunk in range(0, total, 500):
            size = min(total, chunk + 500) - chunk
            await asyncio.gather(*(pool.enqueue_job("arq_noop") for _ in range(size)))
        await wait_until(lambda: _zero(redis.zcard(ARQ_QUEUE)))
        elapsed = time.perf_counter() - started
    finally:
        stop(procs)
        await pool.aclose()
    return total / elapsed


async def _arq_ready(redis: aioredis.Redis, n: int) -> bool:
    return len(await redis.keys("arq:queue:health-check")) >= 1 or await _clients(redis) >= n + 2


async def _clients(redis: aioredis.Redis) -> int:
    return len(await redis.client_list())


async def memory(redis: aioredis.Redis) -> tuple[float, float]:
    """(bytes per idle session with one finished job, bytes per queued job), via used_memory deltas."""
    await redis.flushall()
    queue = Queue(redis, config(), end_marker_ttl_ms=1)
    await queue.load_scripts()
    n = 2000
    base = await _used(redis)

    async def noop(ctx: JobContext) -> dict[str, Any]:
        return {"exit_code": 0}

    await queue.enqueue_batch([_tool_job(i) for i in range(n)])
    consumer = Consumer(queue, "mem", noop, concurrency=64, block_ms=100)
    task = asyncio.create_task(consumer.run())
    await wait_until(lambda: _zero(redis.zcard("af:work")))
    await consumer.stop()
    await task
    await redis.delete("af:events", "af:ready")  # fleet-wide streams, not per session
    await wait_until(lambda: _no_out_streams(redis))
    idle = (await _used(redis) - base) / n
    before = await _used(redis)
    await queue.enqueue_batch([_tool_job(i) for i in range(n)])
    await redis.delete("af:events")
    queued = (await _used(redis) - before) / n
    return idle, queued


def _tool_job(i: int) -> NewJob:
    payload = {"tool": "bash", "arguments": {"command": "ls -la"}}
    return NewJob("bench", f"m{i}", JobKind.TOOL, payload, "bench")


async def _no_out_streams(redis: aioredis.Redis) -> bool:
    async for _ in redis.scan_iter(match="af:out:*", count=1000):
        return False
    return True


async def _used(redis: aioredis.Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_embedded_redis(tmp)
        redis = aioredis.Redis.from_url(server.url)
        try:
            figures: dict[str, float] = {}
            figures["noop_jobs_per_s_1w"] = await ours_throughput(redis, server.url, 1)
            print(f"ours, 1 worker process:  {figures['noop_jobs_per_s_1w']:8.0f} no-op jobs/s")
            figures["noop_jobs_per_s_2w"] = await ours_throughput(redis, server.url, 2)
            print(f"ours, 2 worker processes: {figures['noop_jobs_per_s_2w']:8.0f} no-op jobs/s")
            p50, p99 = await ours_latency(redis, server.url)
            figures["enqueue_to_start_p50_ms"], figures["enqueue_to_start_p99_ms"] = p50, p99
            print(f"enqueue->start latency, idle worker: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            figures["arq_noop_jobs_per_s"] = await arq_throughput(redis, server.url, 1)
            figures["arq_noop_jobs_per_s_2w"] = await arq_throughput(redis, server.url, 2)
            print(f"arq, 1 worker process:   {figures['arq_noop_jobs_per_s']:8.0f} no-op jobs/s")
            print(f"arq, 2 worker processes: {figures['arq_noop_jobs_per_s_2w']:8.0f} no-op jobs/s")
            figures["ratio_vs_arq"] = figures["noop_jobs_per_s_1w"] / figures["arq_noop_jobs_per_s"]
            figures["ratio_vs_arq_2w"] = figures["noop_jobs_per_s_2w"] / figures["arq_noop_jobs_per_s_2w"]
            r1, r2 = figures["ratio_vs_arq"], figures["ratio_vs_arq_2w"]
            print(f"ratio vs arq: {r1:.1f}x (1 worker), {r2:.1f}x (2)")
            idle, queued = await memory(redis)
            figures["bytes_per_idle_session"], figures["bytes_per_queued_job"] = idle, queued
            print(f"redis memory: {idle:.0f} B per idle session (one finished job), "
                  f"{queued:.0f} B per queued job")
        finally:
            await redis.aclose()
            server.stop()
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["ours", "arq"])
    parser.add_argument("--url")
    parser.add_argument("--id", default="w")
    args = parser.parse_args()
    os.chdir(REPO)
    if args.worker == "ours":
        asyncio.run(our_worker(args.url, args.id))
    elif args.worker == "arq":
        arq_worker(args.url)
    else:
        asyncio.run(main())
