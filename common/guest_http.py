"""The guest client's HTTP/1.1 transport: h11 over asyncio streams, keep-alive, a small pool.

Why not httpx here: a worker makes one guest request per tool call, and httpx spent ~0.8 ms of
CPU per request (measured with py-spy in bench/e2e.py) — the largest single cost of a call. h11
(the protocol engine httpx and uvicorn use themselves) with a tiny pool costs a fraction of it.
The guest speaks only JSON request/response, so this transport does exactly that and no more:
no redirects, no cookies, no streaming bodies.

Errors are builtin ones for the caller to translate: OSError (connect/reset/missing socket),
TimeoutError, and ProtocolError for a malformed answer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import h11

#: Bytes read from the socket at a time.
READ_BYTES = 65536
#: Idle connections kept per client (a worker rarely has more than one call in flight per guest).
MAX_IDLE = 4


class ProtocolError(Exception):
    """The peer answered something that is not a well-formed HTTP/1.1 response."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection

    def close(self) -> None:
        self.writer.close()


class GuestHTTP:
    """JSON over HTTP/1.1 to one guest: a unix socket (`uds`) or `base_url` (http or https)."""

    def __init__(self, base_url: str, uds: str | None, headers: dict[str, str],
                 tls: ssl.SSLContext | None, connect_timeout_s: float) -> None:
        url = urlsplit(base_url)
        self._uds = uds
        self._host = url.hostname or "guest"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = tls if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        extra = {k.lower(): v for k, v in headers.items()}
        # Cluster routing selects the actor by Host header: an explicit one wins over the URL's.
        self._headers = [("host", extra.pop("host", url.netloc or self._host)), *extra.items()]
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        async with asyncio.timeout(self._connect_timeout_s):
            if self._uds:
                reader, writer = await asyncio.open_unix_connection(self._uds)
            else:
                reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._tls)
        return _Conn(reader, writer, h11.Connection(our_role=h11.CLIENT))

    async def request(self, method: str, path: str, *, params: Mapping[str, object] | None = None,
                      body: bytes | None = None, timeout_s: float) -> tuple[int, bytes]:
        """One request/response; the connection goes back to the pool when both sides are done."""
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        headers = list(self._headers)
        if body is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        conn = self._idle.pop() if self._idle else await self._connect()
        try:
            async with asyncio.timeout(timeout_s):
                status, data = await self._exchange(conn, method, target, headers, body)
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return status, data

    async def _exchange(self, conn: _Conn, method: str, target: str, headers: list[tuple[str, str]],
                        body: bytes | None) -> tuple[int, bytes]:
        try:
            out = conn.h11.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                out += conn.h11.send(h11.Data(data=body))
            out += conn.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as err:
            raise ProtocolError(str(err)) from err
        conn.writer.write(out)
        await conn.writer.drain()
        status, chunks = 0, []
        while True:
            try:
                event = conn.h11.next_event()
            except h11.RemoteProtocolError as err:
                raise ProtocolError(str(err)) from err
            if event is h11.NEED_DATA:
                data = await conn.reader.read(READ_BYTES)
                if not data and conn.h11.their_state is not h11.DONE:
                    raise ConnectionResetError("the guest closed the connection mid-answer")
                conn.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the guest closed the connection")

    def _release(self, conn: _Conn) -> None:
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE and len(self._idle) < MAX_IDLE:
            conn.h11.start_next_cycle()
            self._idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
