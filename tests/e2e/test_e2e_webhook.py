"""A job's callback through the real fleet: delivered, signed per Standard Webhooks, visible on the job."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from common.webhook_signing import verify
from tests.e2e.conftest import RunningFleet

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the `test` secret of base_config


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        Receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def test_callback_is_signed_and_recorded(fleet: RunningFleet, receiver: str) -> None:
    body = {
        "call_id": "w",
        "type": "function_call",
        "auto_resume": True,
        "function": {"name": "bash", "arguments": json.dumps({"command": "echo hooked"})},
        "callback_url": receiver,
        "callback_secret_id": "test",
    }
    with fleet.client() as c:
        job = c.post(
            "/v1/environments/my-env/sessions/hook-1", json=body, headers={"Prefer": "respond-async"}
        ).json()
        deadline = time.monotonic() + 30
        while not Receiver.received:
            assert time.monotonic() < deadline, "no webhook arrived"
            time.sleep(0.05)
        headers, raw = Receiver.received[0]
        verify(SECRET, headers, raw)  # raises if the signature does not verify
        payload = json.loads(raw)
        assert headers["webhook-id"] == job["id"]
        assert payload["type"] == "job.completed" and payload["data"]["id"] == job["id"]
        assert payload["data"]["result"]["output"] == "hooked\n"
        while not (attempts := c.get(f"/v1/jobs/{job['id']}").json()["webhook_attempts"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert attempts[0]["status"] == 204
        assert "atefleet_webhook_attempts_total" in c.get("/metrics").text


def test_lifecycle_jobs_take_callbacks_too(fleet: RunningFleet, receiver: str) -> None:
    with fleet.client() as c:
        r = c.post(
            "/v1/environments/my-env/sessions/hook-2/resume", json={"callback_url": receiver, "async": True}
        )
        assert r.status_code == 202
        deadline = time.monotonic() + 30
        while not Receiver.received:
            assert time.monotonic() < deadline, "no webhook arrived"
            time.sleep(0.05)
        payload = json.loads(Receiver.received[0][1])
        assert payload["data"]["id"] == r.json()["id"] and payload["data"]["result"]["status"] == "ok"
        bad = c.post("/v1/environments/my-env/sessions/hook-2/suspend", json={"callback_url": "ftp://x"})
        assert bad.status_code == 422
