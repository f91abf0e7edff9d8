"""`atefleet reconciler`: the reconciler process — leader election and the passes it runs.

Wiring only: Redis, the Substrate client, the queue and the reconciler's store are opened here,
passed down by hand, and closed here. Every instance waits to lead (`reconciler.leader`); the
leader runs each pass on its own period until it stops or loses the lease, then competes again:

- queue repair then idle, every `period_s`;
- status sync with Substrate, every `sync_period_s`;
- garbage collection, every `gc_period_s`.

A failing pass (Redis or Substrate unreachable) is logged and tried again next period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from common.config import Config
from common.metrics import serve_role_endpoints
from common.queue import Queue
from common.routing import substrate_address
from common.substrate import SubstrateClient, make_substrate_client
from reconciler.gc import GcPass
from reconciler.idle import IdlePass
from reconciler.leader import LeaderLease
from reconciler.queue_repair import queue_repair_pass
from reconciler.report import PassReport, measured
from reconciler.status_sync import StatusSync
from reconciler.store import ReconcilerStore

log = logging.getLogger("atefleet.reconciler")

Pass = tuple[str, Callable[[PassReport], Awaitable[None]]]


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(2).hex()}"


class Reconciler:
    """The passes of one instance and the leader lease they run under."""

    def __init__(self, config: Config, redis: aioredis.Redis, substrate: SubstrateClient,
                 instance_id: str) -> None:
        self.config = config
        self.queue = Queue(redis, config)
        self.store = ReconcilerStore(redis, self.queue.keys)
        self.leader = LeaderLease(self.store, instance_id, config.reconciler.leader_ttl_s)
        self.idle = IdlePass(config, self.queue, self.store)
        self.sync = StatusSync(config, self.store, substrate, self.leader)
        self.gc = GcPass(config, self.queue, self.store)

    async def _queue_repair(self, report: PassReport) -> None:
        await queue_repair_pass(self.queue, report)

    def _schedules(self) -> list[tuple[float, list[Pass]]]:
        r = self.config.reconciler
        return [
            (r.period_s, [("queue_repair", self._queue_repair), ("idle", self.idle.run)]),
            (r.sync_period_s, [("status_sync", self.sync.run)]),
            (r.gc_period_s, [("gc", self.gc.run)]),
        ]

    async def full_pass(self) -> list[PassReport]:
        """Queue repair, idle and status sync once each, in that order (benchmarks, tests)."""
        return [await measured(name, run) for name, run in self._schedules()[0][1] + self._schedules()[1][1]]

    async def serve(self, stop: asyncio.Event) -> None:
        """Compete for the lease; lead until it is lost or `stop` is set; repeat until stopped."""
        while await self.leader.wait_until_leader(stop):
            await self._lead(stop)

    async def _lead(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._every(period, passes)) for period, passes in self._schedules()]
        keeper = asyncio.create_task(self.leader.keep())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([keeper, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Passes stop before the lease is released, so no pass acts after another instance leads.
            for task in (*tasks, keeper, stopping):
                task.cancel()
            await asyncio.gather(*tasks, keeper, stopping, return_exceptions=True)
            await self.leader.release()

    async def _every(self, period_s: float, passes: list[Pass]) -> None:
        while True:
            for name, run in passes:
                try:
                    await measured(name, run)
                except Exception:  # a failed pass is retried next period
                    log.exception("reconciler pass failed", extra={"fields": {"pass": name}})
            await asyncio.sleep(period_s)


async def serve_reconciler(config: Config, stop: asyncio.Event, instance_id: str = "",
                           metrics_port: int = 0) -> None:
    """Run one reconciler instance until `stop` is set."""
    if not config.redis.url:
        raise SystemExit("atefleet reconciler: redis.url (or $ATEFLEET_REDIS_URL) is required")
    redis = aioredis.Redis.from_url(config.redis.url, socket_keepalive=True, health_check_interval=30)
    substrate = make_substrate_client(config, substrate_address(config))
    reconciler = Reconciler(config, redis, substrate, instance_id or default_instance_id())
    endpoints = await serve_role_endpoints("0.0.0.0", metrics_port, lambda: True) if metrics_port else None
    log.info("reconciler started", extra={"fields": {"instance": reconciler.leader.instance_id}})
    try:
        await reconciler.serve(stop)
    finally:
        if endpoints is not None:
            endpoints.close()
        # Substrate first: it waits for shielded resume/suspend calls a cancelled pass left running.
        await substrate.close()
        await redis.aclose()
        log.info("reconciler stopped")


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _main(config: Config, metrics_port: int) -> None:
    await serve_reconciler(config, _stop_on_signals(), metrics_port=metrics_port)


def run_reconciler(config: Config, metrics_port: int) -> None:
    """Entry point of `atefleet reconciler`."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(config, metrics_port))
