"""The SSRF guard and the pinned transport (workers/webhook_target.py), over real loopback HTTP."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator

import httpx
import pytest

from common.config import WebhookConfig
from workers.webhook_target import TargetRefused, forbidden_reason, make_client, pick_address


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "private"),
        ("100.64.0.1", "non-global"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_forbidden_reason(address: str, reason: str | None) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "scheme"),
        ("http://127.0.0.1:9/x", "loopback"),
        ("http://[::1]:9/x", "loopback"),
        ("http://localhost:9/x", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
    ],
)
async def test_pick_address_refuses(url: str, message: str) -> None:
    with pytest.raises(TargetRefused, match=message):
        await pick_address(httpx.URL(url), allow_private=False)


async def test_pick_address_accepts_public_literals_and_private_when_allowed() -> None:
    public = await pick_address(httpx.URL("https://93.184.216.34/"), allow_private=False)
    assert str(public) == "93.184.216.34"
    assert str(await pick_address(httpx.URL("http://127.0.0.1:9/"), allow_private=True)) == "127.0.0.1"


class Receiver:
    """A raw loopback HTTP server that records every connection and request head."""

    def __init__(self, status: bytes = b"204 No Content", extra_headers: bytes = b"") -> None:
        self.connections = 0
        self.heads: list[bytes] = []
        self._answer = b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n" + extra_headers + b"\r\n"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(self._answer)
            await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    rec = Receiver(b"302 Found", b"location: http://127.0.0.1:1/elsewhere\r\n")
    server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    yield rec, server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def test_pinned_request_keeps_host_and_follows_no_redirect(receiver: tuple[Receiver, int]) -> None:
    rec, port = receiver
    async with make_client(WebhookConfig(allow_private_targets=True)) as client:
        response = await client.post(f"http://localhost:{port}/hook", content=b"{}")
    # The connection went to the resolved IP, the request still names the host it was meant for
    assert response.status_code == 302
    assert rec.connections == 1
    head = rec.heads[0].decode().lower()
    assert head.startswith("post /hook http/1.1")
    assert f"host: localhost:{port}" in head


async def test_refused_target_is_never_contacted(receiver: tuple[Receiver, int]) -> None:
    rec, port = receiver
    async with make_client(WebhookConfig(allow_private_targets=False)) as client:
        for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]"):
            with pytest.raises(TargetRefused):
                await client.post(f"http://{host}:{port}/hook", content=b"{}")
    assert rec.connections == 0
