"""Request body size limit (`api.body_max_bytes`) as ASGI middleware answering 413 problem+json.

Two checks, because a client may not declare its size: a `Content-Length` over the limit is
refused before any byte of the body is read, and one within it is trusted, because the server
frames the body by it (bytes past it would be the next request; uvicorn refuses a request with
two lengths, or with a length and `Transfer-Encoding`). A body without a declared length (a
chunked upload) is counted as it arrives, and the request cut off as soon as it passes the limit.

When the stream is cut off, the app sees an exception from `receive()`. FastAPI turns errors
while reading a body into its own 400, so this middleware does not rely on the app's answer: it
suppresses whatever the app sends after the cut and answers the 413 itself (unless the app had
already started its response, in which case the error propagates and the server drops the
connection).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.problems import PayloadTooLarge, problem_response


class BodyLimitMiddleware:
    """Refuse HTTP request bodies larger than `max_bytes` with a 413 problem."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(scope, receive, send)
            return
        if declared is not None:
            # The server frames the body by its Content-Length (HTTP/1.1: any bytes past it are
            # the next request; with Transfer-Encoding too, the request is refused): no more can
            # arrive, so nothing needs counting.
            await self.app(scope, receive, send)
            return
        await _LimitedRequest(self, scope, receive, send).run()

    def problem(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body exceeds {self.max_bytes} bytes", max_bytes=self.max_bytes)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(self.problem(), scope.get("path"))
        # The unread body stays on the connection: close it rather than let the server drain it.
        response.headers["Connection"] = "close"
        await response(scope, receive, send)


class _LimitedRequest:
    """One request passed to the app with a counting `receive` and a `send` that can be muted."""

    def __init__(self, limit: BodyLimitMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        self.limit = limit
        self.scope = scope
        self.receive = receive
        self.send = send
        self.received_bytes = 0
        self.cut_off = False
        self.response_started = False

    async def run(self) -> None:
        try:
            await self.limit.app(self.scope, self._receive, self._send)
        except Exception:
            if not self.cut_off or self.response_started:
                raise
        if self.cut_off and not self.response_started:
            await self.limit.refuse(self.scope, self.receive, self.send)

    async def _receive(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.received_bytes += len(message.get("body", b""))
            if self.received_bytes > self.limit.max_bytes:
                self.cut_off = True
                raise self.limit.problem()
        return message

    async def _send(self, message: Message) -> None:
        if self.cut_off and not self.response_started:
            return  # the app's answer to a body it never fully got is replaced by the 413
        if message["type"] == "http.response.start":
            self.response_started = True
        await self.send(message)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # malformed: the server's HTTP parser answers that
    return None
