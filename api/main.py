"""`atefleet api`: serve the HTTP API with uvicorn on the configured address.

Without auth configured, an open shell must not be reachable from the network: the API then
binds loopback only, whatever `listen` says, and says so.
"""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from common.config import Config

log = logging.getLogger("atefleet.api")


def bind_host(config: Config) -> str:
    """The host to bind: `listen`'s host, or loopback when auth is not configured."""
    host, _ = config.listen_host_port
    if config.auth.enabled:
        return host or "0.0.0.0"
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("auth is not configured: listening on loopback only (configure auth to expose the API)")
    return "127.0.0.1" if host != "::1" else "::1"


def run_api(config: Config) -> None:
    _, port = config.listen_host_port
    uvicorn.run(
        create_app(config),
        host=bind_host(config),
        port=port,
        loop="asyncio",
        http="httptools",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        limit_concurrency=20000,
        backlog=4096,
    )
