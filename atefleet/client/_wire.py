"""What both transports share: a request and an answer as plain values, the request's bytes, the
response parser (httptools: llhttp, in C) they feed from their sockets, and `Pool`: where the API
is and the keep-alive connections kept for it."""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode, urlsplit

import httptools

C = TypeVar("C")

#: A request target or header name as it may go on the wire: no spaces or control characters, so
#: no caller-supplied value can split or smuggle a request.
_TOKEN = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\x80-\xff]*")


class ProtocolError(Exception):
    """The API answered something that is not a well-formed HTTP/1.1 response."""


@dataclass(slots=True)
class Request:
    """One HTTP request to the API; `headers` by lower-case name, `body` already encoded."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        if not self.params:
            return self.path
        query = {k: _param(v) for k, v in self.params.items() if v is not None}
        return self.path + (f"?{urlencode(query)}" if query else "")


def _param(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def endpoint(base_url: str, tls: ssl.SSLContext | None) -> tuple[str, int, ssl.SSLContext | None]:
    """Host, port and TLS context (for https only; the default one unless given) of a base URL."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    context = (tls or ssl.create_default_context()) if url.scheme == "https" else None
    return url.hostname or "127.0.0.1", port, context


class Pool(Generic[C]):
    """One API base URL's address, the headers sent with every request, and idle connections `C`."""

    def __init__(self, base_url: str, headers: Mapping[str, str], tls: ssl.SSLContext | None,
                 connect_timeout_s: float) -> None:
        self._host, self._port, self._tls = endpoint(base_url, tls)
        self._fixed = header_lines(headers)  # checked once, sent with every request
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[C] = []


def header_lines(headers: Mapping[str, str]) -> str:
    """Header lines, after checking each can go on the wire as it is."""
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or ":" in name or not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} cannot be sent")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


def request_bytes(request: Request, fixed_headers: str) -> bytes:
    """The request as one write: head (with the client's `fixed_headers` lines) and body."""
    target = request.target
    if not _TOKEN.fullmatch(target):
        raise ProtocolError(f"request target {target!r} cannot be sent")
    body = request.body
    if body is not None:
        length = f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
    else:
        length = "content-length: 0\r\n" if request.method in ("POST", "PUT", "PATCH", "DELETE") else ""
    head = (f"{request.method} {target} HTTP/1.1\r\n{fixed_headers}{header_lines(request.headers)}"
            f"{length}\r\n").encode("latin-1")
    return head + body if body else head


class ResponseParser:
    """One connection's answers, one at a time: status, headers, body chunks, completion."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        """Before each request on the connection."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.head_done = False
        self.complete = False
        #: Whether the connection may carry another request after this answer.
        self.keep_alive = False
        self._framed = False

    def feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as err:
            raise ProtocolError(f"malformed answer from the API: {err!r}") from err

    def eof(self) -> None:
        """The peer closed: ends an answer framed by the close; anything else was cut short."""
        if self.head_done and not self._framed and not self.complete:
            self.complete = True
        elif not self.complete:
            raise ConnectionResetError("the API closed the connection before answering in full")

    def take_chunks(self) -> list[bytes]:
        chunks, self.chunks = self.chunks, []
        return chunks

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self.headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (e.g. 103 Early Hints): the real one follows
            self.headers, self._framed = {}, False
            return
        self.status, self.head_done = status, True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self._parser.should_keep_alive()
