"""Picking a free loopback port for a server about to start (the embedded Redis, the local
Substrate, and the servers tests start)."""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(avoid: Collection[int] = ()) -> int:
    """A loopback port free now, other than `avoid`: ports the caller's other servers are about
    to bind (the kernel may hand a port just released by its chooser out again)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
