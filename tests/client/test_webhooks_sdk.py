"""The SDK's webhook verification and its WSGI receiver (the ASGI one runs in test_examples.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import httpx
import pytest

from atefleet.client import WebhookVerificationError, verify_webhook, wsgi_webhook_app
from atefleet.client.webhooks import sign

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def signed(body: bytes, secret: str = SECRET, at: int | None = None) -> dict[str, str]:
    at = int(time.time()) if at is None else at
    return {"Webhook-Id": "msg_1", "Webhook-Timestamp": str(at),
            "Webhook-Signature": sign(secret, "msg_1", at, body)}


def test_verify_webhook_returns_the_event_or_refuses() -> None:
    body = json.dumps({"type": "job.completed", "data": {"id": "j1"}}).encode()
    assert verify_webhook(signed(body), body, SECRET)["data"]["id"] == "j1"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(signed(body), body + b" ", SECRET)  # tampered body
    with pytest.raises(WebhookVerificationError):
        verify_webhook(signed(body, at=int(time.time()) - 3600), body, SECRET)  # replayed
    with pytest.raises(WebhookVerificationError):
        verify_webhook({}, body, SECRET)
    not_json = b"[1"
    with pytest.raises(WebhookVerificationError):
        verify_webhook(signed(not_json), not_json, SECRET)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def wsgi_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    events: list[dict[str, Any]] = []
    server = make_server("127.0.0.1", 0, wsgi_webhook_app(SECRET, events.append), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", events
    server.shutdown()
    thread.join(10)


def test_wsgi_receiver(wsgi_receiver: tuple[str, list[dict[str, Any]]]) -> None:
    url, events = wsgi_receiver
    body = b'{"type": "job.completed", "data": {"id": "j2"}}'
    assert httpx.post(url, content=body, headers=signed(body)).status_code == 204
    forged = signed(body, "whsec_QUFBQUFBQUFBQUFBQUFBQQ==")
    assert httpx.post(url, content=body, headers=forged).status_code == 400
    assert httpx.get(url).status_code == 405
    assert [e["data"]["id"] for e in events] == ["j2"]
