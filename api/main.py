"""`atefleet api`: serve the HTTP API with uvicorn on the configured address.

Without auth configured, an open shell must not be reachable from the network: the API then
binds loopback only, whatever `listen` says, and says so.
"""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from common.config import Config
from common.event_loop import UVICORN_LOOP

log = logging.getLogger("atefleet.api")


def run_api(config: Config) -> None:
    host, port = config.listen_host_port
    if config.api_bind_host != (host or "0.0.0.0"):
        log.warning("auth is not configured: listening on loopback only (configure auth to expose the API)")
    uvicorn.run(
        create_app(config),
        host=config.api_bind_host,
        port=port,
        loop=UVICORN_LOOP,
        http="httptools",
        log_config=None,
        access_log=False,
        # Nothing reads the client address (rate limits are per principal, no access log), so
        # rewriting it from X-Forwarded-For on every request is work for nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        limit_concurrency=20000,
        backlog=4096,
    )
