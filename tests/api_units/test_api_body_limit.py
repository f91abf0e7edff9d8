"""Body size limit: declared Content-Length and counted streamed bytes both answer 413 problem+json."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import Message, Receive, Scope, Send

from api.body_limit import BodyLimitMiddleware
from api.problems import install_problem_handlers

LIMIT = 1024
CONFIG = {"api": {"body_max_bytes": LIMIT}}
PROBLEM = "https://atefleet.dev/problems/payload_too_large"


def _json_of_size(size: int) -> bytes:
    """A JSON object body of exactly `size` bytes."""
    skeleton = json.dumps({"pad": ""}).encode()
    return json.dumps({"pad": "x" * (size - len(skeleton))}).encode()


async def _chunks(body: bytes, chunk: int = 100) -> AsyncIterator[bytes]:
    for start in range(0, len(body), chunk):
        yield body[start:start + chunk]


async def test_declared_length_over_the_limit_is_413(make_client: Any) -> None:
    response = await make_client(CONFIG).post(
        "/echo-size", content=_json_of_size(LIMIT + 1), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == PROBLEM
    assert response.json()["max_bytes"] == LIMIT


async def test_body_at_the_limit_passes(make_client: Any) -> None:
    response = await make_client(CONFIG).post(
        "/echo-size", content=_json_of_size(LIMIT), headers={"content-type": "application/json"})
    assert response.status_code == 200


async def test_streamed_body_over_the_limit_is_413(make_client: Any) -> None:
    # given a chunked upload (no Content-Length) that grows past the limit
    body = _json_of_size(LIMIT * 3)
    response = await make_client(CONFIG).post(
        "/echo-size", content=_chunks(body), headers={"content-type": "application/json"})
    # then the counted bytes trip the limit, and FastAPI's own 400 for the broken body is replaced
    assert response.status_code == 413
    assert response.json()["type"] == PROBLEM


async def test_streamed_body_under_the_limit_passes(make_client: Any) -> None:
    body = _chunks(_json_of_size(LIMIT - 10))
    headers = {"content-type": "application/json"}
    response = await make_client(CONFIG).post("/echo-size", content=body, headers=headers)
    assert response.status_code == 200
    assert response.json() == {"keys": 1}


async def test_app_reading_the_stream_itself_is_cut_off(asgi_client: Any) -> None:
    # given an app that streams the body itself and never checks its size
    seen: list[int] = []
    app = FastAPI()
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=LIMIT)

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        async for chunk in request.stream():
            seen.append(len(chunk))
        return {"bytes": sum(seen)}

    response = await asgi_client(app).post("/upload", content=_chunks(b"x" * (LIMIT * 5)))
    # then it never sees more than the limit plus one chunk, and the client gets the 413
    assert response.status_code == 413
    assert sum(seen) <= LIMIT


async def test_a_declared_length_bounds_what_the_server_delivers(serve: Any) -> None:
    # given the middleware served by uvicorn, in front of an app that counts what it receives
    seen: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message: Message = {"more_body": True}
        while message.get("more_body"):
            message = await receive()
            seen.append(len(message.get("body", b"")))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    address = await serve(BodyLimitMiddleware(app, max_bytes=LIMIT))
    # when a request declares a small length but also a chunked body far over the limit
    reader, writer = await asyncio.open_connection(*address)
    chunk = b"x" * (LIMIT * 2)
    writer.write(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\ntransfer-encoding: chunked\r\n\r\n"
                 + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
    # then the server refuses it, and the app never sees a byte past the declared length
    assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 400")
    writer.close()
    await writer.wait_closed()
    assert sum(seen) <= 10
