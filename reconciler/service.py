"""The reconciler of one instance: its passes, their periods, and the leader lease they run under.

Every instance waits to lead (`reconciler.leader`); the leader runs each pass on its own period
until it stops or loses the lease, then competes again:

- queue repair, idle, then the fleet statistics (`common.fleet_stats`), every `period_s`;
- status sync with Substrate, every `sync_period_s`;
- garbage collection, every `gc_period_s`.

A failing pass (Redis or Substrate unreachable) is logged and tried again next period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from common.config import Config
from common.fleet_stats import StatsPass
from common.queue import Queue
from common.redis.client import RedisClient
from common.substrate import SubstrateClient
from reconciler.capacity_pass import CapacityPass
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

    def __init__(self, config: Config, redis: RedisClient, substrate: SubstrateClient,
                 instance_id: str) -> None:
        self.config = config
        self.queue = Queue(redis, config)
        self.store = ReconcilerStore(redis, self.queue.keys)
        self.leader = LeaderLease(self.store, instance_id, config.reconciler.leader_ttl_s)
        self.idle = IdlePass(config, self.queue, self.store)
        self.capacity = CapacityPass(config, redis, substrate)
        self.sync = StatusSync(config, self.store, substrate, self.leader)
        self.gc = GcPass(config, self.queue, self.store)
        self.stats = StatsPass(config, redis, self.queue.keys)

    async def _queue_repair(self, report: PassReport) -> None:
        await queue_repair_pass(self.queue, report)

    def _schedules(self) -> list[tuple[float, list[Pass]]]:
        r = self.config.reconciler
        return [
            (r.period_s, [("queue_repair", self._queue_repair), ("idle", self.idle.run),
                          ("fleet_stats", self.stats.run), ("capacity", self.capacity.run)]),
            (r.sync_period_s, [("status_sync", self.sync.run)]),
            (r.gc_period_s, [("gc", self.gc.run)]),
        ]

    async def full_pass(self) -> list[PassReport]:
        """Queue repair, idle and status sync once each, in that order (benchmarks, tests)."""
        (_, every_period), (_, status_sync) = self._schedules()[:2]
        return [await measured(name, run) for name, run in every_period + status_sync]

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
