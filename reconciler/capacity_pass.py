"""Capacity pass: Substrate's workers as ListWorkers shows them, recorded for GET /v1/capacity,
and the capacity gauges (workers, sessions running / parked / waiting, the oldest wait).

On a cluster this is the only place workers are counted (seed 002: "watch the workers list");
the local Substrate answers ListWorkers with its slots.
"""

from __future__ import annotations

import logging

from common.capacity import Capacity
from common.config import Config
from common.metrics import CAPACITY_OLDEST_WAIT, CAPACITY_SESSIONS, SUBSTRATE_WORKERS
from common.redis.client import RedisClient
from common.substrate import SubstrateClient, SubstrateError
from reconciler.report import PassReport

log = logging.getLogger("atefleet.reconciler.capacity")


class CapacityPass:
    def __init__(self, config: Config, redis: RedisClient, substrate: SubstrateClient) -> None:
        self.capacity = Capacity(redis, config)
        self.substrate = substrate

    async def run(self, report: PassReport) -> None:
        try:
            workers = await self.substrate.list_workers()
        except SubstrateError as err:  # the last recorded count stays, with its time
            log.warning("ListWorkers failed; capacity not updated", extra={"fields": {"error": str(err)}})
        else:
            report.examined += len(workers)
            await self.capacity.publish_workers(len(workers), sum(1 for w in workers if w.actor_id))
        view = await self.capacity.view()
        for state in ("total", "busy", "free"):
            if view["workers"][state] is not None:
                SUBSTRATE_WORKERS.labels(state=state).set(view["workers"][state])
        for state, count in view["sessions"].items():
            CAPACITY_SESSIONS.labels(state=state).set(count)
        CAPACITY_OLDEST_WAIT.set(view["wait_queue"]["oldest_wait_s"])
