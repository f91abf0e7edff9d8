"""The hot path's own reading of a request: headers as starlette reads them, the body whole."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive

from api.hot_path import headers_of, read_body

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
