"""`atefleet worker`: one worker process — queue consumer, Substrate client, guest router, handlers.

Wiring only: everything is opened here, passed down by hand, and closed here in order. On
SIGTERM the consumer stops taking sessions, finishes (or hands back) the ones in flight within
its grace period, and only then are the Substrate channel and Redis closed, because in-flight
jobs still need both to record their outcome.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from common.capacity import Capacity
from common.config import Config
from common.event_loop import run_network_role
from common.gc_tuning import collect_rarely
from common.metrics import serve_role_endpoints
from common.queue import Consumer, Queue
from common.redis.client import RedisClient
from common.redis.settings import role_settings
from common.routing import make_router, substrate_address
from common.secret_box import SecretBox, load_key
from common.signals import stop_on_signals
from common.substrate import make_substrate_client
from workers.actors import ActorKeeper
from workers.handlers import JobHandlers

log = logging.getLogger("atefleet.worker")

#: Allocations between two young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 20_000


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def serve_worker(config: Config, worker_id: str, metrics_port: int = 0,
                       stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or SIGTERM/SIGINT when `stop` is None)."""
    settings = role_settings("worker", config.redis.url)
    stop = stop or stop_on_signals()
    redis = RedisClient(settings)
    substrate = make_substrate_client(config, substrate_address(config))
    actors = ActorKeeper(config, substrate, make_router(config), Capacity(redis, config))
    queue = Queue(redis, config)
    handlers = JobHandlers(config, actors, SecretBox(load_key(config.state_dir)))
    consumer = Consumer(queue, worker_id or default_worker_id(), handlers,
                        concurrency=config.workers.concurrency)
    actors.on_waiting = consumer.set_waiting  # turns waiting for a Substrate worker: see set_waiting
    endpoints = await serve_role_endpoints("0.0.0.0", metrics_port, lambda: True) if metrics_port else None
    log.info("worker started", extra={"fields": {"worker": consumer.worker_id,
                                                  "concurrency": config.workers.concurrency}})
    run = asyncio.create_task(consumer.run())
    listener = asyncio.create_task(actors.listen(), name="capacity-listener")
    try:
        await asyncio.wait([run, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    finally:
        await consumer.stop()
        if not run.done():
            run.cancel()
        listener.cancel()
        await asyncio.gather(run, listener, return_exceptions=True)
        if endpoints is not None:
            endpoints.close()
        await actors.close()
        await substrate.close()
        await redis.aclose()
        log.info("worker stopped")


def run_worker(config: Config, worker_id: str, metrics_port: int) -> None:
    collect_rarely(GC_YOUNG_THRESHOLD)  # the worker process only, not whoever runs serve_worker
    os.nice(config.workers.nice)  # below the API and Redis: see WorkerConfig.nice
    run_network_role(serve_worker(config, worker_id, metrics_port))
