"""Benchmark of the per-session FIFO queue against arq, on one embedded Redis (loopback).

Figures: no-op jobs/s end to end (enqueue -> complete) over 1,000 sessions with 1 and 2 worker
processes, and Redis's own CPU per job in each run; enqueue->start latency p50/p99 with idle
workers; the same no-op workload through arq (same worker processes, max_jobs = our concurrency,
poll_delay 50 ms) and the ratio; Redis bytes per idle session (one finished job) and per queued
job. `--workers N [N ...]` adds runs with N worker processes, pushing until Redis's CPU is the
limit, and prints the ceiling of one Redis primary implied by the Redis CPU per job of the run
where Redis was busiest (docs/scaling.md). Run: `.venv/bin/python bench/queue.py`.
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
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import redis.asyncio as aioredis  # noqa: E402

from common.config import parse_config  # noqa: E402
from common.embedded_redis import start_embedded_redis  # noqa: E402
from common.queue import Consumer, JobContext, JobKind, JobWaiter, NewJob, Queue  # noqa: E402
from common.redis.client import RedisClient  # noqa: E402

SESSIONS = 1000
JOBS_PER_SESSION = 20
CONCURRENCY = 64
LATENCY_SAMPLES = 500
ARQ_QUEUE = "arq:queue"


def config() -> Any:
    return parse_config({"workers": {"lease_ttl_s": 10, "jobs_per_turn": 8}})


# -- worker processes ----------------------------------------------------------------------------
async def our_worker(url: str, worker_id: str) -> None:
    queue = Queue(RedisClient.from_url(url), config())

    async def noop(ctx: JobContext) -> dict[str, Any]:
        return {"t": time.time()} if ctx.job.payload.get("lat") else {}

    consumer = Consumer(queue, worker_id, noop, concurrency=CONCURRENCY, block_ms=1000)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(consumer.stop()))
    await consumer.run()
    await queue.redis.aclose()


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


@dataclass(frozen=True)
class Throughput:
    """One run of the no-op workload through our queue."""

    jobs_per_s: float
    #: Redis's own CPU (user + sys, the whole process) over the run, per job.
    redis_cpu_us_per_job: float
    #: Redis's CPU seconds per second of the run: near 1.0, its command thread was the limit.
    redis_busy: float
    #: The worker processes' CPU (user + sys, all of them) over the run, per job: the client
    #: side's cost, steadier than throughput on a shared machine.
    worker_cpu_us_per_job: float

    @property
    def ceiling_jobs_per_s(self) -> float:
        """Jobs/s one primary carries once its CPU is the limit: Redis runs commands on one thread,
        so one CPU-second over the CPU per job (whole-process CPU: a conservative figure)."""
        return 1e6 / self.redis_cpu_us_per_job


async def ours_throughput(
    redis: aioredis.Redis, url: str, workers: int, jobs_per_session: int = JOBS_PER_SESSION
) -> Throughput:
    await redis.flushall()
    queue = Queue(RedisClient.from_url(url), config())
    await queue.load_scripts()
    procs = spawn("ours", url, workers)
    try:
        await wait_until(lambda: _consumers_ready(redis, workers))
        cpu_before, workers_before = await _redis_cpu_s(redis), _processes_cpu_s(procs)
        started = time.perf_counter()
        for i in range(jobs_per_session):
            await queue.enqueue_batch(
                [NewJob("bench", f"s{n}", JobKind.TOOL, {"i": i}, "bench") for n in range(SESSIONS)]
            )
        await wait_until(lambda: _zero(redis.zcard("af:work")))
        elapsed = time.perf_counter() - started
        cpu_s = await _redis_cpu_s(redis) - cpu_before
        workers_s = _processes_cpu_s(procs) - workers_before
    finally:
        stop(procs)
        await queue.redis.aclose()
    jobs = SESSIONS * jobs_per_session
    return Throughput(jobs / elapsed, cpu_s / jobs * 1e6, cpu_s / elapsed, workers_s / jobs * 1e6)


def _processes_cpu_s(procs: list[subprocess.Popen[bytes]]) -> float:
    """CPU seconds (user + sys) the processes have used so far, from /proc/<pid>/stat."""
    total = 0
    for proc in procs:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


async def _redis_cpu_s(redis: aioredis.Redis) -> float:
    """CPU seconds the Redis process has used so far (INFO cpu: user + sys)."""
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _consumers_ready(redis: aioredis.Redis, n: int) -> bool:
    """n worker processes are blocked reading their inbox, with their free slots announced."""
    clients = await redis.client_list()
    return sum(1 for c in clients if c.get("cmd") == "blpop") >= n


async def _zero(value: Any) -> bool:
    return int(await value) == 0


async def ours_latency(redis: aioredis.Redis, url: str) -> tuple[float, float]:
    await redis.flushall()
    queue = Queue(RedisClient.from_url(url), config())
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
        await queue.redis.aclose()
    q = statistics.quantiles(samples, n=100)
    return statistics.median(samples), q[98]


async def arq_throughput(
    redis: aioredis.Redis, url: str, workers: int, jobs_per_session: int = JOBS_PER_SESSION
) -> float:
    from arq.connections import RedisSettings, create_pool

    await redis.flushall()
    pool = await create_pool(RedisSettings.from_dsn(url))
    procs = spawn("arq", url, workers)
    try:
        await wait_until(lambda: _arq_ready(redis, workers))
        total = SESSIONS * jobs_per_session
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


async def memory(redis: aioredis.Redis, url: str) -> tuple[float, float]:
    """(bytes per idle session with one finished job, bytes per queued job), via used_memory deltas."""
    await redis.flushall()
    queue = Queue(RedisClient.from_url(url), config(), end_marker_ttl_ms=1)
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
    await queue.redis.aclose()
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


async def ours_runs(
    redis: aioredis.Redis, url: str, worker_counts: list[int], jobs_per_session: int
) -> dict[str, float]:
    """Our throughput with each count of worker processes, Redis's CPU per job in each, and the
    ceiling of one primary implied by the run where Redis was busiest (nearest its limit)."""
    figures: dict[str, float] = {}
    runs: dict[int, Throughput] = {}
    for n in worker_counts:
        run = runs[n] = await ours_throughput(redis, url, n, jobs_per_session)
        figures[f"noop_jobs_per_s_{n}w"] = run.jobs_per_s
        figures[f"redis_cpu_us_per_job_{n}w"] = run.redis_cpu_us_per_job
        figures[f"redis_busy_{n}w"] = run.redis_busy
        figures[f"worker_cpu_us_per_job_{n}w"] = run.worker_cpu_us_per_job
        print(f"ours, {n} worker process(es): {run.jobs_per_s:8.0f} no-op jobs/s; Redis CPU "
              f"{run.redis_cpu_us_per_job:.1f} µs/job, busy {run.redis_busy:.2f} of a core; workers' CPU "
              f"{run.worker_cpu_us_per_job:.1f} µs/job")
    busiest = max(runs, key=lambda n: runs[n].redis_busy)
    figures["primary_ceiling_jobs_per_s"] = runs[busiest].ceiling_jobs_per_s
    print(f"one Redis primary's ceiling: 1 CPU-s / {runs[busiest].redis_cpu_us_per_job:.1f} µs per job = "
          f"{runs[busiest].ceiling_jobs_per_s:.0f} no-op jobs/s (from the {busiest}-worker run)")
    return figures


async def main(more_workers: list[int], jobs_per_session: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_embedded_redis(tmp)
        redis = aioredis.Redis.from_url(server.url)
        try:
            counts = list(dict.fromkeys([1, 2, *more_workers]))
            figures = await ours_runs(redis, server.url, counts, jobs_per_session)
            p50, p99 = await ours_latency(redis, server.url)
            figures["enqueue_to_start_p50_ms"], figures["enqueue_to_start_p99_ms"] = p50, p99
            print(f"enqueue->start latency, idle worker: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            figures["arq_noop_jobs_per_s"] = await arq_throughput(redis, server.url, 1, jobs_per_session)
            figures["arq_noop_jobs_per_s_2w"] = await arq_throughput(redis, server.url, 2, jobs_per_session)
            print(f"arq, 1 worker process:   {figures['arq_noop_jobs_per_s']:8.0f} no-op jobs/s")
            print(f"arq, 2 worker processes: {figures['arq_noop_jobs_per_s_2w']:8.0f} no-op jobs/s")
            figures["ratio_vs_arq"] = figures["noop_jobs_per_s_1w"] / figures["arq_noop_jobs_per_s"]
            figures["ratio_vs_arq_2w"] = figures["noop_jobs_per_s_2w"] / figures["arq_noop_jobs_per_s_2w"]
            r1, r2 = figures["ratio_vs_arq"], figures["ratio_vs_arq_2w"]
            print(f"ratio vs arq: {r1:.1f}x (1 worker), {r2:.1f}x (2)")
            idle, queued = await memory(redis, server.url)
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
    parser.add_argument("--workers", type=int, nargs="+", default=[], metavar="N",
                        help="also run our queue with N worker processes (each N given)")
    parser.add_argument("--jobs-per-session", type=int, default=JOBS_PER_SESSION,
                        help="jobs per session in the throughput runs (fewer: a quick check)")
    args = parser.parse_args()
    os.chdir(REPO)
    if args.worker == "ours":
        asyncio.run(our_worker(args.url, args.id))
    elif args.worker == "arq":
        arq_worker(args.url)
    else:
        asyncio.run(main(args.workers, args.jobs_per_session))
