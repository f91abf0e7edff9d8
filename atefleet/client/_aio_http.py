"""The async client's HTTP/1.1 transport: httptools (llhttp, in C) on asyncio Protocols, keep-alive.

Why not httpx or aiohttp: with 100 concurrent sessions the client shares the fleet's cores, and
every 0.1 ms of client CPU per call is throughput the fleet loses. bench/sdk.py measures httpx
(tuned: one client, pooled, HTTP/1.1), aiohttp and this transport against the same fleet in one
run; this one costs about what bench/e2e.py's minimal client costs. It does only what the API
needs: JSON requests, whole or streamed (SSE) answers, keep-alive, TLS, timeouts.

Errors are builtin ones, translated by the caller (`atefleet.client.errors` does it once):
OSError for connect/reset, TimeoutError, and ProtocolError for a malformed answer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast
from urllib.parse import urlsplit

import httptools

from atefleet.client._wire import ProtocolError, Request, Response, request_bytes

#: Idle connections kept per client; more than this many concurrent callers open and close extras.
MAX_IDLE = 256

#: Bytes of streamed body held before reading pauses the socket (flow control for SSE).
STREAM_HIGH_WATER = 1 << 20


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    _transport: asyncio.Transport  # set by connection_made, before any other callback

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[tuple[int, dict[str, str]]] | None = None
        self._headers: dict[str, str] = {}
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._framed = False
        self._head_done = False
        self._finished = True
        self._paused = False
        self._buffered = 0
        #: Why the answer ended early, when it did (the reader raises it after the last chunk).
        self.broken: Exception | None = None
        #: False once the connection must not carry another request.
        self.reusable = True

    def send(self, data: bytes) -> asyncio.Future[tuple[int, dict[str, str]]]:
        """Write a request; the future resolves with (status, headers) once the head is in."""
        self._head = asyncio.get_running_loop().create_future()
        self._headers, self._chunks = {}, asyncio.Queue()
        self._framed = self._head_done = self._finished = False
        self.broken = None
        self.reusable = False  # until a complete keep-alive answer says otherwise
        self._transport.write(data)
        return self._head

    async def body(self) -> bytes:
        parts = []
        while (chunk := await self._chunks.get()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            self._buffered -= len(chunk)
            if self._paused and self._buffered < STREAM_HIGH_WATER // 2:
                self._paused = False
                self._transport.resume_reading()
            yield chunk

    def close(self) -> None:
        self.reusable = False
        self._transport.close()

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            self._fail(ProtocolError(f"malformed answer from the API: {err!r}"))

    def eof_received(self) -> bool:
        if self._head_done and not self._framed and not self._finished:
            self._end(keep_alive=False)  # an answer without a length ends at the peer's close
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        err = ConnectionResetError("the API closed the connection mid-answer")
        err.__cause__ = exc
        self._fail(err)

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self._headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._headers = {}
            return  # an interim answer (e.g. 103 Early Hints): the real one follows
        self._head_done = True
        if self._head is not None and not self._head.done():
            self._head.set_result((status, self._headers))

    def on_body(self, body: bytes) -> None:
        self._chunks.put_nowait(body)
        self._buffered += len(body)
        if self._buffered > STREAM_HIGH_WATER and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._head_done:
            self._end(self._parser.should_keep_alive())

    def _end(self, keep_alive: bool) -> None:
        self._finished = True
        self.reusable = keep_alive
        self._chunks.put_nowait(None)

    def _fail(self, err: Exception) -> None:
        self.reusable = False
        self._transport.close()
        if self._head is not None and not self._head.done():
            self._head.set_exception(err)
        elif not self._finished:
            self._finished = True
            self.broken = err
            self._chunks.put_nowait(None)


class AsyncTransport:
    """Requests to one API base URL over a pool of keep-alive connections."""

    def __init__(self, base_url: str, tls: ssl.SSLContext | None, connect_timeout_s: float) -> None:
        url = urlsplit(base_url)
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            _, conn = await loop.create_connection(_Conn, self._host, self._port, ssl=self._tls)
        return conn

    def _take(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:  # the API may have closed it while it sat idle
                return conn
        return None

    def _give_back(self, conn: _Conn) -> None:
        if conn.reusable and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()

    async def _open(self, request: Request, head_bytes: bytes) -> tuple[_Conn, int, dict[str, str]]:
        conn = self._take() or await self._connect()
        try:
            status, headers = await conn.send(head_bytes)
        except BaseException:
            conn.close()
            raise
        return conn, status, headers

    async def send(self, request: Request, timeout_s: float) -> Response:
        """One request, the whole answer read; the connection goes back to the pool after it."""
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(timeout_s):
                conn, status, headers = await self._open(request, request_bytes(request))
                body = await conn.body()
                _check_complete(conn)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        self._give_back(conn)
        return Response(status, headers, body)

    async def stream(self, request: Request,
                     connect_timeout_s: float) -> tuple[Response, AsyncGenerator[bytes, None]]:
        """The answer's head (with an empty body) and an iterator over its body as it arrives.

        The iterator must be run to the end or closed (`aclose`); either releases the connection."""
        async with asyncio.timeout(connect_timeout_s):
            conn, status, headers = await self._open(request, request_bytes(request))

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in conn.chunks():
                    yield chunk
                _check_complete(conn)
            except BaseException:
                conn.close()
                raise
            self._give_back(conn)

        return Response(status, headers, b""), body()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _check_complete(conn: _Conn) -> None:
    if conn.broken is not None:
        raise conn.broken
