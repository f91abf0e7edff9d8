"""`atefleet api`: serve the HTTP API with uvicorn on the configured address.

Without auth configured, an open shell must not be reachable from the network: the API then
binds loopback only, whatever `listen` says, and says so.

The listening socket has SO_REUSEPORT, so several API processes (`api.processes` under
`atefleet up`, or replicas started by hand) share one port and the kernel spreads connections
across them. A stateless API scales out that way on one host, as behind a load balancer.
"""

from __future__ import annotations

import logging
import socket

import uvicorn

from api.app import create_app
from api.http_protocol import HttpProtocol
from common.config import Config
from common.event_loop import UVICORN_LOOP
from common.gc_tuning import collect_rarely

log = logging.getLogger("atefleet.api")

#: Pending connections the kernel queues per API process.
BACKLOG = 4096

#: Seconds an idle client connection is kept open.
KEEP_ALIVE_S = 75

#: Net allocations between two young-generation garbage collections (see common/gc_tuning.py).
GC_YOUNG_THRESHOLD = 10_000


def run_api(config: Config) -> None:
    host, port = config.listen_host_port
    if config.api_bind_host != (host or "0.0.0.0"):
        log.warning("auth is not configured: listening on loopback only (configure auth to expose the API)")
    server = uvicorn.Server(uvicorn.Config(
        create_app(config),
        loop=UVICORN_LOOP,
        http=HttpProtocol,
        log_config=None,
        access_log=False,
        # Nothing reads the client address (rate limits are per principal, no access log), so
        # rewriting it from X-Forwarded-For on every request is work for nothing.
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        # Longer than common clients keep an idle connection (httpx 5 s, aiohttp 15 s): with equal
        # timeouts the server closes a connection just as a client reuses it, and the client does
        # not retry the POST it lost ("Server disconnected without sending a response").
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=20000,
    ))
    collect_rarely(GC_YOUNG_THRESHOLD)
    server.run(sockets=[listening_socket(config.api_bind_host, port)])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (shared by every API process), listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock
