"""A webhook receiver for atefleet's job callbacks, in FastAPI: two ways.

- `POST /hooks/manual`: a FastAPI route that verifies the raw body itself with `verify_webhook`;
- `POST /hooks/asgi`: the SDK's `asgi_webhook_app` as the route's app, which verifies and then
  calls `on_event` (any ASGI framework can route to it; `wsgi_webhook_app` is the same for WSGI).

Both refuse (400) a callback whose Standard Webhooks signature or timestamp does not check out.
Give a job `callback_url` (this server's URL) and `callback_secret_id` (the id of the secret in
the fleet's `webhooks.secrets`; this receiver needs the same secret):

    ATEFLEET_WEBHOOK_SECRET=whsec_... .venv/bin/uvicorn --factory examples.webhook_receiver:from_env \
        --port 8900
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request, Response

from atefleet.client import WebhookVerificationError, asgi_webhook_app, verify_webhook


def create_app(secret: str, events: list[dict[str, Any]]) -> FastAPI:
    """The receiver; every verified event is appended to `events` (a real one would enqueue it)."""
    app = FastAPI()

    @app.post("/hooks/manual")
    async def manual(request: Request) -> Response:
        try:
            event = verify_webhook(request.headers, await request.body(), secret)
        except WebhookVerificationError:
            return Response(status_code=400)
        events.append(event)
        return Response(status_code=204)

    async def on_event(event: dict[str, Any]) -> None:
        events.append(event)

    app.add_route("/hooks/asgi", asgi_webhook_app(secret, on_event), methods=["POST"])
    return app


def from_env() -> FastAPI:
    """The receiver with the secret from `$ATEFLEET_WEBHOOK_SECRET`, printing each event."""
    events: list[dict[str, Any]] = []
    app = create_app(os.environ["ATEFLEET_WEBHOOK_SECRET"], events)

    @app.middleware("http")
    async def report(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        while events:
            print(events.pop(0))
        return response

    return app
