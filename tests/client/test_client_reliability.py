"""Retries, timeouts, lost connections and SSE resumption, against a scripted stand-in API (a real
HTTP server on loopback whose answers each test lists), for both clients; and the problem classes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from atefleet.client import AsyncClient, Client, Job, OutputChunk
from atefleet.client.errors import (
    PROBLEM_CLASSES,
    ConflictError,
    ConnectError,
    JobExpiredError,
    ProblemError,
    RateLimitedError,
    RequestTimeout,
    UnavailableError,
    problem_error,
)
from atefleet.client.models import Problem
from common.problem_types import PROBLEM_TYPES, problem_body

OK = json.dumps({"type": "function_call_output", "name": "bash", "output": "hi\n"}).encode()
JOB = {"id": "j1", "state": "succeeded", "result": {"output": "x"}}


def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


def problem(status: int, slug: str, **headers: str) -> bytes:
    return answer(status, json.dumps(problem_body(status, slug, "t")).encode(),
                  {"content-type": "application/problem+json", **headers})


@dataclass
class StandIn:
    """A loopback HTTP/1.1 server answering each request with the next scripted action: bytes to
    send, "close" (drop the connection unanswered) or "hang" (never answer)."""

    script: list[bytes | str]
    requests: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while self.script:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            lines = head.decode().split("\r\n")
            fields = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            await reader.readexactly(int(fields.get("content-length", 0)))
            self.requests.append({"request-line": lines[0], **fields})
            action = self.script.pop(0)
            if action == "close":
                writer.close()
                return
            if action == "hang":
                await asyncio.sleep(3600)
            assert isinstance(action, bytes)
            writer.write(action)
            await writer.drain()
            if b"connection: close" in action:
                break
        writer.close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn([])
    loop = asyncio.new_event_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    started = loop.run_until_complete(asyncio.start_server(server._serve, sock=sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server

    def stop() -> None:
        started.close()
        for task in asyncio.all_tasks(loop):
            task.cancel()

    loop.call_soon_threadsafe(stop)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05}


def test_retries_keep_the_idempotency_key_and_honour_retry_after(stand_in: StandIn) -> None:
    # Given an API that is overloaded, then unavailable, then drops the answer, then answers
    stand_in.script = [problem(429, "rate_limited", **{"retry-after": "1"}), problem(503, "unavailable"),
                       "close", answer(200, OK)]
    with Client(stand_in.url, **FAST) as client:
        result = client.session("e", "s").bash("echo hi")
    # Then the call succeeds, and every attempt carried the same Idempotency-Key
    assert result.output == "hi\n"
    keys = {r["idempotency-key"] for r in stand_in.requests}
    assert len(stand_in.requests) == 4 and len(keys) == 1


async def test_async_retries_then_gives_up_with_the_problem(stand_in: StandIn) -> None:
    stand_in.script = [problem(503, "unavailable")] * 3
    async with AsyncClient(stand_in.url, max_retries=2, **FAST) as client:
        with pytest.raises(UnavailableError) as err:
            await client.session("e", "s").bash("x")
    assert err.value.status == 503 and len(stand_in.requests) == 3
    assert len({r["idempotency-key"] for r in stand_in.requests}) == 1


def test_a_new_logical_call_gets_a_new_key(stand_in: StandIn) -> None:
    stand_in.script = [answer(200, OK), answer(200, OK)]
    with Client(stand_in.url) as client:
        client.session("e", "s").bash("a")
        client.session("e", "s").bash("a")
    assert stand_in.requests[0]["idempotency-key"] != stand_in.requests[1]["idempotency-key"]


def test_timeouts_and_unreachable(stand_in: StandIn) -> None:
    stand_in.script = ["hang"]
    with Client(stand_in.url, timeout_s=0.3, max_retries=0) as client, pytest.raises(RequestTimeout):
        client.job("j1")
    with Client("http://127.0.0.1:9", max_retries=0) as client, pytest.raises(ConnectError):
        client.job("j1")


async def test_async_timeout(stand_in: StandIn) -> None:
    stand_in.script = ["hang"]
    async with AsyncClient(stand_in.url, timeout_s=0.3, max_retries=0) as client:
        with pytest.raises(RequestTimeout):
            await client.job("j1")


def sse(*events: tuple[str, str, dict[str, object]]) -> bytes:
    body = "".join(f"id: {i}\nevent: {e}\ndata: {json.dumps(d)}\n\n" for i, e, d in events).encode()
    # No length and no chunking: the stream ends when the server closes it (as a dropped one does).
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + body


def test_stream_reconnects_with_last_event_id(stand_in: StandIn) -> None:
    stand_in.script = [sse(("1-0", "output", {"stream": "stdout", "data": "a"})),
                       sse(("2-0", "output", {"stream": "stdout", "data": "b"}), ("3-0", "result", JOB))]
    with Client(stand_in.url, **FAST) as client:
        events = list(client.stream("j1"))
    assert [e.data for e in events if isinstance(e, OutputChunk)] == ["a", "b"]
    assert isinstance(events[-1], Job)
    assert "last-event-id" not in stand_in.requests[0]
    assert stand_in.requests[1]["last-event-id"] == "1-0"


async def test_async_stream_reconnects_with_last_event_id(stand_in: StandIn) -> None:
    stand_in.script = [sse(("1-0", "output", {"stream": "stdout", "data": "a"})), "close",
                       sse(("3-0", "result", JOB))]
    async with AsyncClient(stand_in.url, **FAST) as client:
        events = [e async for e in client.stream("j1")]
    assert isinstance(events[-1], Job) and events[-1].id == "j1"
    assert [r.get("last-event-id") for r in stand_in.requests] == [None, "1-0", "1-0"]


def test_every_documented_problem_type_has_its_class() -> None:
    assert set(PROBLEM_TYPES) <= set(PROBLEM_CLASSES)
    for slug in PROBLEM_TYPES:
        status = int(PROBLEM_TYPES[slug][:3])
        err = problem_error(Problem.model_validate(problem_body(status, slug, "t")))
        assert err.slug == slug and type(err) is PROBLEM_CLASSES[slug]


def test_problem_classes_by_last_segment_then_by_status() -> None:
    assert isinstance(problem_error(Problem(type="urn:x:job-expired", status=404)), JobExpiredError)
    assert isinstance(problem_error(Problem(type="https://x/new_thing", status=409)), ConflictError)
    assert type(problem_error(Problem(type="https://x/odd", status=418))) is ProblemError
    assert isinstance(problem_error(Problem(type="https://x/rate_limited", status=429)), RateLimitedError)
