"""The hot path's own reading of a request (headers as starlette reads them, the body whole), and
its answers against FastAPI's own route."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive

from api.app import create_app
from api.hot_path import HotPath, headers_of, read_body
from common.config import parse_config
from tests.api_units.conftest import client_for

RAW = [(b"host", b"api"), (b"prefer", b"respond-async"), (b"x-twice", b"first"), (b"x-twice", b"second"),
       (b"x-latin", "caf\xe9".encode("latin-1"))]


def test_headers_answer_as_starlettes() -> None:
    scope = {"type": "http", "headers": RAW}
    ours, theirs = headers_of(scope), Headers(scope=scope)
    for name in ("host", "prefer", "x-twice", "x-latin", "authorization"):
        assert ours.get(name) == theirs.get(name)


def receiving(*messages: Message) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return receive


async def test_body_is_every_chunk_joined() -> None:
    receive = receiving({"type": "http.request", "body": b"ab", "more_body": True},
                        {"type": "http.request", "body": b"cd", "more_body": False})
    assert await read_body(receive) == b"abcd"


async def test_a_client_gone_before_the_body_ended_is_starlettes_disconnect() -> None:
    receive = receiving({"type": "http.request", "body": b"ab", "more_body": True},
                        {"type": "http.disconnect"})
    with pytest.raises(ClientDisconnect):
        await read_body(receive)


async def test_a_sessions_view_answers_as_fastapis_own_route(redis_url: str, tmp_path: Path) -> None:
    # given the API as served (the hot path in front) and its FastAPI app alone, on one real Redis,
    # with a session whose resume is queued
    config = parse_config({"state_dir": str(tmp_path), "environments": [{"name": "my-env", "template": "t"}]})
    served = create_app(config, redis_url=redis_url)
    fastapi = served.app.app  # type: ignore[attr-defined]
    assert isinstance(served.app, HotPath) and isinstance(fastapi, FastAPI)
    hot, own = client_for(served), client_for(fastapi)
    async with fastapi.router.lifespan_context(fastapi), hot, own:
        queued = await own.post("/v1/environments/my-env/sessions/view-1/resume",
                                headers={"Prefer": "respond-async"})
        assert queued.status_code == 202

        # then each view answers the same on both: a session, one never seen, an unknown
        # environment, an invalid id
        for path in ("view-1", "never-seen", "-bad"):
            for base in ("/v1/environments/my-env/sessions/", "/v1/environments/nope/sessions/"):
                a, b = await hot.get(base + path), await own.get(base + path)
                assert a.status_code == b.status_code
                assert a.headers["content-type"] == b.headers["content-type"]
                assert a.json() == b.json(), base + path
        view = (await hot.get("/v1/environments/my-env/sessions/view-1")).json()
        assert view["session"] == "view-1" and view["queue_depth"] == 1
