"""The worker's guest client against a hostile guest (a real HTTP server on a unix socket that
answers what a guest taken over by its tenant could): answers are bounded in size, and a call
that never ends is given up past its timeout_max_s, its execution killed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from common import guest_client
from common.guest_client import GuestClient, GuestProtocolError, answer_bound
from common.guest_protocol import GuestAddress

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


def _running(job_id: str) -> bytes:
    view = {"job_id": job_id, "state": "running", "attached": False, "stdout": "", "stderr": "",
            "stdout_offset": 0, "stderr_offset": 0, "more_output": False, "result": None}
    body = json.dumps(view).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def _request_line(reader: asyncio.StreamReader) -> str:
    """Read one request (head and body) and return its request line."""
    line = (await reader.readline()).decode()
    length = 0
    while (header := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return line


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[Callable[[Answer], Awaitable[tuple[str, list[str]]]]]:
    """Factory: serve `answer` on a unix socket; returns the socket path and the request lines seen."""
    servers: list[asyncio.AbstractServer] = []

    async def start(answer: Answer) -> tuple[str, list[str]]:
        seen: list[str] = []
        path = str(tmp_path / f"hostile-{len(servers)}.sock")

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    line = await _request_line(reader)
                    if not line:
                        return
                    seen.append(line)
                    await answer(reader, writer, line)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        servers.append(await asyncio.start_unix_server(serve, path))
        return path, seen

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_guest_answering_running_forever_is_given_up_and_killed(
    hostile: Callable[[Answer], Awaitable[tuple[str, list[str]]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a guest that says "running" to every start and poll, at once
    async def forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> None:
        writer.write(_running("j1"))
        await writer.drain()

    path, seen = await hostile(forever)
    monkeypatch.setattr(guest_client, "RUN_SLACK_S", 0.5)  # the slack is seconds; the rule is the same
    async with GuestClient(GuestAddress(uds=path), actor="a") as client:
        # when a call whose environment allows 1 s runs, then the worker gives it up
        with pytest.raises(GuestProtocolError, match="past timeout_max_s"):
            await client.run("j1", "bash", {"command": "true"}, limits={"timeout_max_s": 1.0})
    # and it killed the execution on its way out
    assert seen[-1].startswith("POST /v1/executions/j1/cancel ")


async def test_an_endless_answer_is_cut_at_its_bound(
    hostile: Callable[[Answer], Awaitable[tuple[str, list[str]]]],
) -> None:
    # given a guest that streams a chunked body without end
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * (1 << 20)
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()

    path, _ = await hostile(endless)
    async with GuestClient(GuestAddress(uds=path), actor="a") as client:
        with pytest.raises(GuestProtocolError, match="answer body over"):
            await client.list_processes()


async def test_an_endless_head_is_cut_at_its_bound(
    hostile: Callable[[Answer], Awaitable[tuple[str, list[str]]]],
) -> None:
    async def headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        while True:
            writer.write(b"x-filler: " + b"y" * 4096 + b"\r\n")
            await writer.drain()

    path, _ = await hostile(headers)
    async with GuestClient(GuestAddress(uds=path), actor="a") as client:
        with pytest.raises(GuestProtocolError, match="answer head over"):
            await client.list_processes()


def test_the_bound_grows_with_what_a_call_may_legitimately_return() -> None:
    small = answer_bound({"output_max_bytes": 1 << 20, "file_max_bytes": 1 << 20})
    large = answer_bound({"output_max_bytes": 1 << 20, "file_max_bytes": 64 << 20})
    # a 64 MiB file JSON-escaped at worst still fits; the default limits give a finite bound
    assert large > 6 * (64 << 20) > small and answer_bound(None) < 128 << 20
