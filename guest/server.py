"""A minimal HTTP/1.1 server for JSON request/response routes: httptools (llhttp, in C) on an
asyncio Protocol.

Keep-alive, pipelining-safe (one request handled at a time per connection, answered in order;
reading pauses while requests wait), a body size cap (413), a head size cap and malformed
requests (400): each refusal is answered after the requests before it, then the connection is
closed. No streaming: every answer is one JSON document, head and body in one write.

A client's EOF ends the connection and cancels the handler it was waiting for (a long-poll
stops at once): the worker never half-closes, it closes a connection it gave up on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import httptools

log = logging.getLogger(__name__)

#: Largest request body accepted (write_file content is base64 of up to file_max_bytes).
MAX_BODY_BYTES = 64 << 20

#: Largest request line + headers accepted, counted as each one is parsed (llhttp sets no limit).
MAX_HEAD_BYTES = 64 << 10

#: The error code of each refusal the server itself answers (the connection is closed after it).
_REFUSAL_CODES = {400: "bad_request", 413: "body_too_large"}


def _query(query: str) -> dict[str, str]:
    """A query string's parameters. urllib.parse is imported at the first request that has one
    (an execution's poll), not at every guest start: every cold resume pays for what it imports."""
    from urllib.parse import parse_qsl

    return dict(parse_qsl(query))


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


Handler = Callable[[Request], Awaitable[tuple[int, Any]]]


class _Rejected(Exception):
    """Raised from a parser callback to stop parsing a request the server refuses."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@functools.cache
def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    return f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n".encode()


def _response(status: int, payload: Any, keep_alive: bool) -> bytes:
    """The answer to write; `payload` is encoded as JSON, unless it is bytes: JSON already."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
    close = b"" if keep_alive else b"connection: close\r\n"
    return b"%scontent-length: %d\r\n%s\r\n%s" % (_status_line(status), len(body), close, body)


class _Connection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive, answers them one at a time."""

    _transport: asyncio.Transport  # set by connection_made, before any other callback

    def __init__(self, handler: Handler, connections: set[_Connection]) -> None:
        self._handler = handler
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        #: Complete requests not answered yet, with whether the connection stays open after each.
        self._pending: deque[tuple[Request, bool]] = deque()
        #: The answer to a request the server refused, written (then closed) after the pending ones.
        self._refusal: bytes | None = None
        #: Answers the pending requests; None while there is nothing to answer.
        self.task: asyncio.Task[None] | None = None
        #: Set while the transport's write buffer is over its high-water mark.
        self._drained: asyncio.Future[None] | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream socket's transport
        self._connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # bytes after a refused request mean nothing
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as err:
            cause = err.__context__
            if isinstance(cause, _Rejected):
                self._refuse(cause.status, str(cause))
            else:
                self._refuse(400, f"malformed request: {err}")
        self._answer_soon()

    def eof_received(self) -> bool:
        return False  # close: see the module docstring

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if self.task is not None:
            self.task.cancel()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._head_bytes = b"", {}, 0
        self._body, self._body_bytes = [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        self._count_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        # Refuse an announced oversize body before it arrives.
        if int(self._headers.get("content-length") or 0) > MAX_BODY_BYTES:
            raise _Rejected(413, f"request body over {MAX_BODY_BYTES} bytes")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:  # a chunked body has no length up front
            raise _Rejected(413, f"request body over {MAX_BODY_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self._url.decode("latin-1").partition("?")
        request = Request(
            self._parser.get_method().decode("latin-1"),
            path,
            _query(query) if query else {},
            self._headers,
            b"".join(self._body),
        )
        self._pending.append((request, self._parser.should_keep_alive()))
        if len(self._pending) > 1:
            self._transport.pause_reading()  # a pipelining client waits for its answers

    # ---- answering -------------------------------------------------------------------------
    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _Rejected(400, f"request head over {MAX_HEAD_BYTES} bytes")

    def _refuse(self, status: int, message: str) -> None:
        answer = {"error": _REFUSAL_CODES[status], "message": message}
        self._refusal = _response(status, answer, keep_alive=False)
        self._transport.pause_reading()

    def _answer_soon(self) -> None:
        if self.task is None and (self._pending or self._refusal is not None):
            self.task = asyncio.get_running_loop().create_task(self._answer_all())

    async def _answer_all(self) -> None:
        transport = self._transport
        while self._pending:
            request, keep_alive = self._pending.popleft()
            answer = await self._answer(request, keep_alive)
            if transport.is_closing():
                return  # the client is gone (EOF seen; connection_lost not run yet)
            transport.write(answer)
            if not keep_alive:
                transport.close()
                return
            if self._drained is not None:
                await self._drained
        self.task = None
        if transport.is_closing():
            return
        if self._refusal is not None:
            transport.write(self._refusal)
            transport.close()
        else:
            transport.resume_reading()

    async def _answer(self, request: Request, keep_alive: bool) -> bytes:
        try:
            status, payload = await self._handler(request)
            return _response(status, payload, keep_alive)
        except Exception as err:  # a handler bug answers 500 instead of dropping the connection
            log.exception("internal error on %s %s", request.method, request.path)
            return _response(500, {"error": "internal", "message": str(err)}, keep_alive)

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    def abort(self) -> None:
        self._transport.abort()


class HttpServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()

    def _protocol(self) -> _Connection:
        return _Connection(self._handler, self._connections)

    async def listen_unix(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)  # a socket left by a previous guest in this actor
        self._server = await asyncio.get_running_loop().create_unix_server(self._protocol, path=path)

    async def listen_socket(self, sock: socket.socket) -> None:
        """Serve on an already bound and listening unix socket (handed in by the launcher)."""
        self._server = await asyncio.get_running_loop().create_unix_server(self._protocol, sock=sock)

    async def listen_tcp(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host=host or None, port=port)

    async def close(self) -> None:
        """Stop listening, drop every connection and wait for their handlers to end."""
        if self._server is not None:
            self._server.close()
        tasks = [conn.task for conn in self._connections if conn.task is not None]
        for conn in list(self._connections):
            conn.abort()  # connection_lost cancels its handler
        await asyncio.gather(*tasks, return_exceptions=True)
