"""Body size limit: declared Content-Length and counted streamed bytes both answer 413 problem+json."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request

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
