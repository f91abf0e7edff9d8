"""Every example in examples/ runs against the real fleet (their stand-in models are scripted)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import uvicorn

from atefleet.client import Client
from atefleet.client.webhooks import sign
from tests.client.conftest import RunningFleet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: The e2e fleet's webhook secret `test` (tests/e2e/conftest.py).
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openai_agent_loop(fleet: RunningFleet) -> None:
    loop = example("openai_agent_loop")
    conversation = loop.run(fleet.url, "my-env", loop.ScriptedModel(loop.SCRIPT))
    outputs = {i["call_id"]: i["output"] for i in conversation if i.get("type") == "function_call_output"}
    assert outputs["call_1"] == "Successfully wrote 32 bytes to hello.py"
    assert outputs["call_2"] in ("hello from the sandbox\n", "no python\n")
    assert conversation[-1]["type"] == "message"


def test_anthropic_agent_loop(fleet: RunningFleet) -> None:
    loop = example("anthropic_agent_loop")
    messages = loop.run(fleet.url, "my-env", loop.ScriptedModel(loop.SCRIPT))
    results = [block for m in messages if m["role"] == "user" and isinstance(m["content"], list)
               for block in m["content"]]
    assert [r["tool_use_id"] for r in results] == ["toolu_1", "toolu_2", "toolu_3"]
    assert results[-1] == {"type": "tool_result", "tool_use_id": "toolu_3", "content": "42\n",
                           "is_error": False}


def test_fan_out(fleet: RunningFleet) -> None:
    jobs = asyncio.run(example("fan_out").fan_out(fleet.url, "my-env", 20))
    assert len(jobs) == 20 and all(j.state == "succeeded" for j in jobs)


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """examples/webhook_receiver.py served by uvicorn in a thread: its URL and received events."""
    events: list[dict[str, Any]] = []
    app = example("webhook_receiver").create_app(SECRET, events)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", events
    server.should_exit = True
    thread.join(10)


def test_webhook_receiver(fleet: RunningFleet, receiver: tuple[str, list[dict[str, Any]]]) -> None:
    url, events = receiver
    with Client(fleet.url) as client:
        session = client.session("my-env", f"hook-{uuid.uuid4().hex[:8]}", auto_resume=True)
        jobs = [session.submit("bash", {"command": "echo hooked"}, callback_url=f"{url}{path}",
                               callback_secret_id="test") for path in ("/hooks/manual", "/hooks/asgi")]
        for job in jobs:
            client.wait(job)
    deadline = time.monotonic() + 60
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(e["data"]["id"] for e in events) == sorted(j.id for j in jobs)
    assert all(e["data"]["result"]["output"] == "hooked\n" for e in events)
    # A forged callback (signed with another secret) is refused by both receivers
    body = b'{"type": "job.completed", "data": {}}'
    now = int(time.time())
    forged = {"webhook-id": "msg_1", "webhook-timestamp": str(now),
              "webhook-signature": sign("whsec_QUFBQUFBQUFBQUFBQUFBQQ==", "msg_1", now, body)}
    for path in ("/hooks/manual", "/hooks/asgi"):
        assert httpx.post(f"{url}{path}", content=body, headers=forged).status_code == 400
    assert len(events) == 2
