"""The guest client's HTTP/1.1 transport: httptools (llhttp, in C) on asyncio Protocols,
keep-alive, a small pool.

Why not httpx, nor h11 over streams: a worker makes one guest request per tool call; httpx spent
~0.8 ms of CPU per request and h11 (pure Python) with StreamReader/StreamWriter still a large part
of the worker's guest transport (py-spy, bench/e2e.py). Here the parsing is in C, the constant
header bytes are built once per client, and a request is one write. The guest speaks only JSON
request/response, so this transport does exactly that and no more: no redirects, no cookies, no
streaming bodies. Answers may be chunked (a router in front of a guest may chunk them).

Errors are builtin ones for the caller to translate: OSError (connect/reset/missing socket;
ConnectionResetError when the peer closes mid-answer), TimeoutError, ProtocolError for a
malformed answer or an unsendable request, and its AnswerTooLarge for an answer over the
request's bound. The guest runs tenant code, so nothing it sends is trusted to be small: every
answer's head and body are counted as they arrive and the connection is dropped past the bound.
A connection is reused only after a complete answer that allows keep-alive; never after a
timeout, a cancel or an error.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlencode, urlsplit

import httptools

#: Idle connections kept per client (a worker rarely has more than one call in flight per guest).
MAX_IDLE = 4

#: Largest answer head (status line + headers) accepted from a guest.
MAX_HEAD_BYTES = 64 << 10
#: Largest answer body accepted unless the request says otherwise.
DEFAULT_MAX_BODY_BYTES = 16 << 20

#: A request target or header as it may go on the wire: no spaces or control characters, so no
#: caller-supplied value can split or smuggle a request.
_TARGET = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\x80-\xff]*")


class ProtocolError(Exception):
    """The peer answered something that is not a well-formed HTTP/1.1 response."""


class AnswerTooLarge(ProtocolError):
    """The answer's head or body went over its bound (the connection was dropped)."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    _transport: asyncio.Transport  # set by connection_made, before any other callback

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        #: The answer of the request in flight; None between requests.
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []
        #: Bytes of the answer in flight so far (head, then body), and the body's bound.
        self._head_bytes = 0
        self._body_bytes = 0
        self._max_body = DEFAULT_MAX_BODY_BYTES
        #: Whether the answer's head is in, and whether it gave a length or chunking (if not, the
        #: body ends when the peer closes).
        self._head_done = False
        self._framed = False
        #: False once the connection must not carry another request.
        self.reusable = True

    def send(self, data: bytes, max_body: int) -> asyncio.Future[tuple[int, bytes]]:
        """Write one request; the future resolves with (status, body) once the answer is complete,
        or fails with AnswerTooLarge once its body passes `max_body` bytes."""
        self._answer = answer = asyncio.get_running_loop().create_future()
        self._body, self._head_done, self._framed = [], False, False
        self._head_bytes, self._body_bytes, self._max_body = 0, 0, max_body
        self.reusable = False  # until a complete keep-alive answer says otherwise
        self._transport.write(data)
        return answer

    def close(self) -> None:
        self.reusable = False
        self._transport.close()

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream socket's transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            self._fail(ProtocolError(f"malformed answer from the guest: {err!r}"))

    def eof_received(self) -> bool:
        if self._head_done and not self._framed:
            self._finish(keep_alive=False)  # an answer without a length ends at the peer's close
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        err = ConnectionResetError("the guest closed the connection mid-answer")
        err.__cause__ = exc
        self._fail(err)

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._answer is None:
            self.close()  # an answer nobody asked for: the stream is out of step

    def on_status(self, status: bytes) -> None:
        self._count_head(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._head_done = True

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._fail(AnswerTooLarge(f"answer head over {MAX_HEAD_BYTES} bytes"))

    def on_body(self, body: bytes) -> None:
        if self._answer is None:
            return  # failed already (over its bound): the connection is closing
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            self._fail(AnswerTooLarge(f"answer body over {self._max_body} bytes"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            self._body, self._head_done, self._framed = [], False, False
            return  # an interim answer (e.g. 103 Early Hints): the real one follows
        self._finish(self._parser.should_keep_alive())

    # ---- outcome ---------------------------------------------------------------------------
    def _finish(self, keep_alive: bool) -> None:
        answer, self._answer = self._answer, None
        if answer is None or answer.done():
            self.close()  # nobody waits for it any more (timed out or cancelled)
            return
        self.reusable = keep_alive
        answer.set_result((self._parser.get_status_code(), b"".join(self._body)))

    def _fail(self, err: Exception) -> None:
        answer, self._answer = self._answer, None
        self.close()
        if answer is not None and not answer.done():
            answer.set_exception(err)


class GuestHTTP:
    """JSON over HTTP/1.1 to one guest: a unix socket (`uds`) or `base_url` (http or https)."""

    def __init__(
        self,
        base_url: str,
        uds: str | None,
        headers: dict[str, str],
        tls: ssl.SSLContext | None,
        connect_timeout_s: float,
    ) -> None:
        url = urlsplit(base_url)
        self._uds = uds
        self._host = url.hostname or "guest"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._tls = tls if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        extra = {k.lower(): v for k, v in headers.items()}
        # Cluster routing selects the actor by Host header: an explicit one wins over the URL's.
        self._head_fields = _header_bytes({"host": extra.pop("host", url.netloc or self._host), **extra})
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            if self._uds:
                _, conn = await loop.create_unix_connection(_Conn, self._uds)
            else:
                _, conn = await loop.create_connection(_Conn, self._host, self._port, ssl=self._tls)
        return conn

    def _head(self, method: str, path: str, params: Mapping[str, object] | None, body: bytes | None) -> bytes:
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        if not _TARGET.fullmatch(target):
            raise ProtocolError(f"request target {target!r} cannot be sent")
        length = (
            b"" if body is None else b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        )
        return b"%s %s HTTP/1.1\r\n%s%s\r\n" % (method.encode(), target.encode(), self._head_fields, length)

    def _take(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:  # the guest may have closed it while it sat idle
                return conn
        return None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        body: bytes | None = None,
        timeout_s: float,
        max_answer_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> tuple[int, bytes]:
        """One request/response; the connection goes back to the pool after a complete answer."""
        data = self._head(method, path, params, body) + (body or b"")
        conn = self._take() or await self._connect()
        try:
            async with asyncio.timeout(timeout_s):
                answer = await conn.send(data, max_answer_bytes)
        except BaseException:
            conn.close()
            raise
        if conn.reusable and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _header_bytes(headers: dict[str, str]) -> bytes:
    """The constant header lines of every request, checked once so none can break the head."""
    for name, value in headers.items():
        if not _TARGET.fullmatch(name) or ":" in name or not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} cannot be sent")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
