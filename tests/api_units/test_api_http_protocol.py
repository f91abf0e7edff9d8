"""The API's uvicorn protocol sends a response's head and body in one write, and nothing is lost."""

from __future__ import annotations

import asyncio
from typing import Any

from api.http_protocol import FLUSH_AT_BYTES, CoalescedWrites


class RecordingTransport:
    """What CoalescedWrites sees of a transport: writes, close, and any other attribute."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


async def test_writes_of_one_iteration_go_out_together() -> None:
    # given two writes in the same loop iteration
    transport = RecordingTransport()
    writes = CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    writes.write(b"head")
    writes.write(b"body")
    assert transport.writes == []
    # then they are one write at the end of the iteration; other calls reach the transport
    await asyncio.sleep(0)
    assert transport.writes == [b"headbody"]
    assert writes.get_extra_info("peername") == "info:peername"


async def test_a_long_stream_is_not_held() -> None:
    # given writes adding up to the flush size within one iteration
    transport = RecordingTransport()
    writes = CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    chunk = b"x" * (FLUSH_AT_BYTES // 4)
    for _ in range(5):
        writes.write(chunk)
    # then the first four went out together at once, the fifth at the end of the iteration
    assert transport.writes == [chunk * 4]
    await asyncio.sleep(0)
    assert transport.writes == [chunk * 4, chunk]


async def test_close_sends_what_was_written_first_and_nothing_after() -> None:
    transport = RecordingTransport()
    writes = CoalescedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    writes.write(b"last answer")
    writes.close()
    assert transport.writes == [b"last answer"] and transport.closed
    writes.write(b"too late")
    await asyncio.sleep(0)
    assert transport.writes == [b"last answer"]


async def test_a_server_on_the_protocol_answers_keep_alive_requests_whole(serve: Any) -> None:
    # given uvicorn serving a small ASGI app with HttpProtocol
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    reader, writer = await asyncio.open_connection(*await serve(app))
    # when two requests are sent on one connection
    for path in ("/one", "/two"):
        writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        # then each answer is whole: status line, headers and body
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert await reader.readexactly(len(path)) == path.encode()
    writer.close()
    await writer.wait_closed()
