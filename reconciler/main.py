"""`atefleet reconciler`: the reconciler process, wired.

The Redis client (common/redis), the Substrate client and the metrics endpoint are opened here,
passed to `Reconciler` (`reconciler.service`: leader election and the passes), and closed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.config import Config
from common.event_loop import run_network_role
from common.metrics import serve_role_endpoints
from common.redis.client import RedisClient
from common.redis.settings import role_settings
from common.routing import substrate_address
from common.signals import stop_on_signals
from common.substrate import make_substrate_client
from reconciler.service import Reconciler, default_instance_id

log = logging.getLogger("atefleet.reconciler")


async def serve_reconciler(config: Config, stop: asyncio.Event, instance_id: str = "",
                           metrics_port: int = 0) -> None:
    """Run one reconciler instance until `stop` is set."""
    settings = role_settings("reconciler", config.redis.url)
    redis = RedisClient(settings)
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




async def _main(config: Config, metrics_port: int) -> None:
    await serve_reconciler(config, stop_on_signals(), metrics_port=metrics_port)


def run_reconciler(config: Config, metrics_port: int) -> None:
    """Entry point of `atefleet reconciler`."""
    with contextlib.suppress(KeyboardInterrupt):
        run_network_role(_main(config, metrics_port))
