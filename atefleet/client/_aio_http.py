"""The async client's HTTP/1.1 transport: httptools on asyncio Protocols, keep-alive, a pool.

Why not httpx or aiohttp: with 100 concurrent sessions the client shares the fleet's cores, and
every 0.1 ms of client CPU per call is throughput the fleet loses. bench/sdk.py measures httpx
(tuned: one client, pooled, HTTP/1.1), aiohttp and this transport against the same fleet in one
run. It does only what the API needs: JSON requests, whole or streamed (SSE) answers, keep-alive,
TLS, timeouts.

Errors are builtin ones, translated by the caller (`atefleet.client.errors` does it once):
OSError for connect/reset, TimeoutError, and ProtocolError for a malformed answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import cast

from atefleet.client._wire import Pool, Request, Response, ResponseParser, request_bytes

#: Idle connections kept per client; more concurrent callers than this open and close extras.
MAX_IDLE = 256


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    _transport: asyncio.Transport  # set by connection_made, before any other callback

    def __init__(self) -> None:
        self.parser = ResponseParser()
        self._head: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] | None = None
        #: Set while an answer is streamed: each data arrival wakes the reader.
        self._arrived: asyncio.Event | None = None
        self._error: BaseException | None = None
        #: False once the connection must not carry another request.
        self.reusable = True

    def send(self, data: bytes, stream: bool) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
        """Write a request; futures for its head and for its end."""
        loop = asyncio.get_running_loop()
        self.parser.reset()
        self._head, self._done = loop.create_future(), loop.create_future()
        self._arrived = asyncio.Event() if stream else None
        self.reusable = False  # until a complete keep-alive answer says otherwise
        self._transport.write(data)
        return self._head, self._done

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The streamed body as it arrives (after the head)."""
        if self._arrived is None or self._done is None:
            raise RuntimeError("chunks() reads an answer sent with stream=True")
        while True:
            for chunk in self.parser.take_chunks():
                yield chunk
            if self._done.done():
                self._done.result()
                for chunk in self.parser.take_chunks():
                    yield chunk
                return
            self._arrived.clear()
            await self._arrived.wait()

    def close(self) -> None:
        self.reusable = False
        self._transport.close()

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed(data)
        except Exception as err:
            self._fail(err)
            return
        self._progress()

    def eof_received(self) -> bool:
        try:
            self.parser.eof()
        except Exception as err:
            self._fail(err)
            return False
        self._progress()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        err = ConnectionResetError("the API closed the connection mid-answer")
        err.__cause__ = exc
        self._fail(err)

    def _progress(self) -> None:
        parser = self.parser
        if parser.head_done and self._head is not None and not self._head.done():
            self._head.set_result(None)
        if self._arrived is not None:
            self._arrived.set()
        if parser.complete and self._done is not None and not self._done.done():
            self.reusable = parser.keep_alive
            self._done.set_result(None)

    def _fail(self, err: BaseException) -> None:
        self.reusable = False
        self._transport.close()
        for future in (self._head, self._done):
            if future is not None and not future.done():
                future.set_exception(err)
                future.exception()  # marked retrieved: an awaiter still gets it, and none is needed
        if self._arrived is not None:
            self._arrived.set()


class AsyncTransport(Pool[_Conn]):
    """Requests to one API base URL over a pool of keep-alive connections."""

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

    async def send(self, request: Request, timeout_s: float) -> Response:
        """One request, the whole answer read; the connection goes back to the pool after it."""
        conn = await self._start(request, timeout_s, stream=False)
        parser = conn.parser
        response = Response(parser.status, parser.headers, b"".join(parser.take_chunks()))
        self._give_back(conn)
        return response

    async def stream(self, request: Request,
                     head_timeout_s: float) -> tuple[Response, AsyncGenerator[bytes, None]]:
        """The answer's head (with an empty body) and its body as it arrives. Run the body to its
        end or close it (`aclose`); either releases the connection."""
        conn = await self._start(request, head_timeout_s, stream=True)

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in conn.chunks():
                    yield chunk
            except BaseException:
                conn.close()
                raise
            self._give_back(conn)

        return Response(conn.parser.status, conn.parser.headers, b""), body()

    async def _start(self, request: Request, timeout_s: float, stream: bool) -> _Conn:
        """A connection that sent `request` and read its answer's head (all of it unless `stream`)."""
        data = request_bytes(request, self._fixed)
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(timeout_s):
                conn = self._take() or await self._connect()
                head, done = conn.send(data, stream)
                await (head if stream else done)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        return conn

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
