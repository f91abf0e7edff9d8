"""A test worker process: Consumer with a handler that logs start/end per session to Redis.

Each execution appends `S|job|epoch|worker|ts` before and `E|job|epoch|worker|ts` after a random
min..max job ms sleep to `t:log:<session>` (`X|...` instead of `E` when its handler is cancelled),
so tests can detect FIFO violations and overlaps. The consumer's counters are mirrored to the hash
`t:stats:<worker>`. SIGTERM stops it gracefully.
With `--redis-url` given more than once, the process serves each of those Redis servers (cells,
docs/scaling.md) with a Consumer of its own, logging and mirroring into that cell's Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from common.config import Config, parse_config
from common.queue import Consumer, JobContext, Queue
from common.redis.client import RedisClient

#: The Consumer's block_ms: how often an idle worker renews its announcement (chaos tests bound
#: recovery by it).
BLOCK_MS = 200


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True, action="append", help="a cell's Redis (repeatable)")
    p.add_argument("--prefix", default="af:")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--lease-ttl-s", type=float, default=1.0)
    p.add_argument("--min-job-ms", type=float, default=0.0)
    p.add_argument("--max-job-ms", type=float, default=2.0)
    p.add_argument("--jobs-per-turn", type=int, default=8)
    return p.parse_args()


async def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format=f"[{args.worker_id}] %(levelname)s %(message)s")
    config = parse_config({"redis_prefix": args.prefix,
                           "workers": {"lease_ttl_s": args.lease_ttl_s, "jobs_per_turn": args.jobs_per_turn}})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await asyncio.gather(*(serve_cell(url, args, config, stop) for url in args.redis_url))


async def serve_cell(url: str, args: argparse.Namespace, config: Config, stop: asyncio.Event) -> None:
    """One Consumer on the Redis at `url`, until `stop` is set."""
    redis = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
    timeouts = "socket_timeout=5&socket_connect_timeout=2"  # after the URL's own options (TLS files)
    queue = Queue(RedisClient.from_url(f"{url}{'&' if '?' in url else '?'}{timeouts}"), config)

    async def handler(ctx: JobContext) -> dict[str, Any]:
        key = f"t:log:{ctx.lease.session}"
        try:
            await redis.rpush(key, f"S|{ctx.job.id}|{ctx.epoch}|{args.worker_id}|{time.time()}")
            await asyncio.sleep(random.uniform(args.min_job_ms, args.max_job_ms) / 1000)
            await redis.rpush(key, f"E|{ctx.job.id}|{ctx.epoch}|{args.worker_id}|{time.time()}")
        except asyncio.CancelledError:
            # The turn lost its lease (or the stop's grace ran out): the job resumes elsewhere.
            with contextlib.suppress(RedisError, OSError):
                await redis.rpush(key, f"X|{ctx.job.id}|{ctx.epoch}|{args.worker_id}|{time.time()}")
            raise
        return {"worker": args.worker_id, "epoch": ctx.epoch}

    consumer = Consumer(queue, args.worker_id, handler, concurrency=args.concurrency, block_ms=BLOCK_MS)
    stopper = asyncio.create_task(stop_on(stop, consumer))
    stats_task = asyncio.create_task(mirror_stats(redis, consumer, args.worker_id))
    await consumer.run()
    stats_task.cancel()
    await stopper
    await publish_stats(redis, consumer, args.worker_id)
    await queue.redis.aclose()
    await redis.aclose()


async def stop_on(stop: asyncio.Event, consumer: Consumer) -> None:
    await stop.wait()
    await consumer.stop()


async def publish_stats(redis: aioredis.Redis, consumer: Consumer, worker_id: str) -> None:
    try:
        await redis.hset(f"t:stats:{worker_id}", mapping={k: str(v) for k, v in consumer.stats.items()})
    except (RedisError, OSError):
        pass  # Redis restarting: the next tick writes them


async def mirror_stats(redis: aioredis.Redis, consumer: Consumer, worker_id: str) -> None:
    while True:
        await publish_stats(redis, consumer, worker_id)
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(main())
