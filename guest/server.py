"""A minimal HTTP/1.1 server (h11 over asyncio streams) for JSON request/response routes.

Keep-alive connections, a body size cap, no streaming: every answer is one JSON document.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11

log = logging.getLogger(__name__)

#: Largest request body accepted (write_file content is base64 of up to file_max_bytes).
MAX_BODY_BYTES = 64 << 20

READ_BYTES = 65536


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


class HttpServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def listen_unix(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)  # a socket left by a previous guest in this actor
        self._server = await asyncio.start_unix_server(self._serve, path=path)

    async def listen_tcp(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host=host or None, port=port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._loop(h11.Connection(h11.SERVER, max_incomplete_event_size=65536), reader, writer)
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError):
            pass
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()

    async def _loop(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            request = await self._read_request(conn, reader)
            if request is None:
                return
            status, payload = await self._dispatch(request)
            body = json.dumps(payload, separators=(",", ":")).encode()
            headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
            # One write (one syscall) for head, body and end of message.
            head = conn.send(h11.Response(status_code=status, headers=headers)) or b""
            writer.write(
                head + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
            )
            await writer.drain()
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await reader.read(READ_BYTES))

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        event = await self._next(conn, reader)
        if not isinstance(event, h11.Request):
            return None
        body = bytearray()
        while True:
            part = await self._next(conn, reader)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > MAX_BODY_BYTES:
                    raise h11.ProtocolError("request body too large")
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return None
        url = urlsplit(event.target.decode("latin-1"))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        return Request(event.method.decode(), url.path, dict(parse_qsl(url.query)), headers, bytes(body))

    async def _dispatch(self, request: Request) -> tuple[int, Any]:
        try:
            return await self._handler(request)
        except Exception as err:  # a handler bug answers 500 instead of dropping the connection
            log.exception("internal error on %s %s", request.method, request.path)
            return 500, {"error": "internal", "message": str(err)}
