"""uvicorn's httptools protocol, writing each response in one system call instead of two.

uvicorn writes a response's status line and headers when the app sends `http.response.start`,
then the body when it sends `http.response.body`, and uvloop sends each write at once: two
system calls and two TCP segments for every small JSON answer. On loopback each send also runs
the receiver's TCP path: one write instead of two took about a tenth off the API's CPU per
async submit under bench/async.py (and the client wakes up once). `HttpProtocol` gives the
protocol a transport whose writes are held until the end of the current event-loop iteration
(the app sends start and body in the same iteration, without waiting in between) and then sent
together, or sooner past `FLUSH_AT_BYTES`; everything else goes to the real transport.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Held writes reaching this many bytes go out at once: a long stream written within one loop
#: iteration (an SSE batch) then meets the transport's flow control as before, not a growing list.
FLUSH_AT_BYTES = 64 * 1024


class CoalescedWrites:
    """A transport's stand-in: writes of one loop iteration go out as one write."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= FLUSH_AT_BYTES:
            self._flush()

    def close(self) -> None:
        self._flush()  # what was written before close still goes out (then the FIN)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        if not self._transport.is_closing():
            self._transport.write(data)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's `http="httptools"` protocol, over `CoalescedWrites`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A write transport whatever its class (uvloop's do not subclass asyncio.Transport), and
        # the stand-in is one in all but name.
        writes = CoalescedWrites(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(cast(asyncio.Transport, writes))
