"""Tiny webhook receivers: an ASGI app and a WSGI app that verify each callback, then hand its
event to your function. Mount them in any framework (FastAPI/Starlette `app.mount`, Flask/Django
WSGI middleware), or serve them alone. An unverifiable callback is answered 400 and never reaches
the function; the function's own failure is answered 500, so atefleet retries the delivery.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from atefleet.client.webhooks import WebhookVerificationError, verify_webhook

#: What a handler receives: the verified event `{"type", "timestamp", "data": {job}}`.
Event = dict[str, Any]
Handler = Callable[[Event], Awaitable[None] | None]

#: Largest callback body read (atefleet's are a job's JSON; results are capped well below this).
MAX_BODY_BYTES = 16 << 20


class AsgiWebhookApp:
    """An ASGI app answering POSTs: 204 after `handler(event)`, 400 if the signature fails.

    A class, not a function, so routers (Starlette's `Route`) take it as an ASGI app."""

    def __init__(self, secret: str, handler: Handler) -> None:
        self.secret, self.handler = secret, handler

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more and len(body) <= MAX_BODY_BYTES:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status = 405 if scope["method"] != "POST" else await _handle(self.secret, self.handler, headers, body)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def asgi_webhook_app(secret: str, handler: Handler) -> AsgiWebhookApp:
    """The ASGI receiver: mount or route it in any ASGI framework."""
    return AsgiWebhookApp(secret, handler)


async def _handle(secret: str, handler: Handler, headers: dict[str, str], body: bytes) -> int:
    try:
        event = verify_webhook(headers, body, secret)
    except WebhookVerificationError:
        return 400
    outcome = handler(event)
    if inspect.isawaitable(outcome):
        await outcome
    return 204


def wsgi_webhook_app(secret: str, handler: Callable[[Event], None]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering POSTs: 204 after `handler(event)`, 400 if the signature fails."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [])
            return [b""]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(min(length, MAX_BODY_BYTES + 1))
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        try:
            event = verify_webhook(headers, body, secret)
        except WebhookVerificationError:
            start_response("400 Bad Request", [])
            return [b""]
        handler(event)
        start_response("204 No Content", [])
        return [b""]

    return app
