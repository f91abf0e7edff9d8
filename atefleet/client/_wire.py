"""What both transports share: a request and an answer as plain values, and the request's bytes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

#: A request target or header name as it may go on the wire: no spaces or control characters, so
#: no caller-supplied value can split or smuggle a request.
_TOKEN = re.compile(r"[\x21-\x7e]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\x80-\xff]*")


class ProtocolError(Exception):
    """The API answered something that is not a well-formed HTTP/1.1 response."""


@dataclass(frozen=True)
class Request:
    """One HTTP request to the API; `headers` by lower-case name, `body` already encoded."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        query = {k: _param(v) for k, v in (self.params or {}).items() if v is not None}
        return self.path + (f"?{urlencode(query)}" if query else "")


def _param(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def check_request(request: Request) -> str:
    """The request's target, after checking it and every header can go on the wire as they are."""
    target = request.target
    if not _TOKEN.fullmatch(target):
        raise ProtocolError(f"request target {target!r} cannot be sent")
    for name, value in request.headers.items():
        if not _TOKEN.fullmatch(name) or ":" in name or not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} cannot be sent")
    return target


def request_bytes(request: Request) -> bytes:
    """The request as one write: head and body."""
    lines = [f"{request.method} {check_request(request)} HTTP/1.1\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in request.headers.items()]
    body = request.body
    if body is not None:
        lines.append(f"content-type: application/json\r\ncontent-length: {len(body)}\r\n")
    elif request.method in ("POST", "PUT", "PATCH"):
        lines.append("content-length: 0\r\n")
    lines.append("\r\n")
    head = "".join(lines).encode("latin-1")
    return head + body if body else head
