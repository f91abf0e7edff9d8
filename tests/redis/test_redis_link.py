"""What the link does with its settings, against loopback servers that misbehave on purpose:
the operation timeout, the connect timeout, health checks of idle connections, and TLS host name
checking (on by default)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import hiredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.redis.client import RedisClient
from common.redis.link import RedisLink
from common.redis.settings import RedisSettings
from tests.tls_ca import make_tls_files


class FakeRedis:
    """A loopback server that records each command; it answers +PONG / +OK, or nothing at all
    when `silent`."""

    def __init__(self, silent: bool = False) -> None:
        self.silent = silent
        self.commands: list[list[bytes]] = []
        self._changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(65536):
            parser.feed(data)
            while (command := parser.gets()) is not False:
                self.commands.append(command)
                self._changed.set()
                if not self.silent:
                    writer.write(b"+PONG\r\n" if command[0].upper() == b"PING" else b"+OK\r\n")
        writer.close()

    async def seen(self, condition: Callable[[list[list[bytes]]], bool]) -> None:
        """Wait until the commands received so far meet `condition`."""
        while not condition(self.commands):
            self._changed.clear()
            await self._changed.wait()

    def count(self, name: bytes) -> int:
        return sum(1 for c in self.commands if c[0].upper() == name)


async def _serve(fake: FakeRedis, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def silent() -> AsyncIterator[tuple[FakeRedis, int]]:
    fake = FakeRedis(silent=True)
    server, port = await _serve(fake)
    yield fake, port
    server.close()


@pytest.fixture
async def answering() -> AsyncIterator[tuple[FakeRedis, int]]:
    fake = FakeRedis()
    server, port = await _serve(fake)
    yield fake, port
    server.close()


async def test_an_unanswered_command_times_out_after_socket_timeout(silent: tuple[FakeRedis, int]) -> None:
    # given a server that takes commands and never answers, and a 0.2 s operation timeout
    _, port = silent
    link = RedisLink(RedisSettings.from_url(f"redis://127.0.0.1:{port}?socket_timeout=0.2"))
    try:
        # when a command is sent, then it fails as redis-py's TimeoutError (an outage to callers)
        with pytest.raises(RedisTimeoutError, match="0.2 s"):
            await asyncio.wait_for(link.execute("GET", "k"), timeout=30)
    finally:
        await link.aclose()


async def test_without_socket_timeout_a_slow_reply_is_waited_for(silent: tuple[FakeRedis, int]) -> None:
    fake, port = silent
    link = RedisLink(RedisSettings.from_url(f"redis://127.0.0.1:{port}?health_check_interval=0"))
    try:
        waiting = asyncio.ensure_future(link.execute("GET", "k"))
        await fake.seen(lambda commands: len(commands) == 1)
        assert not waiting.done()
        waiting.cancel()
    finally:
        await link.aclose()


async def test_a_blocking_command_gets_its_block_time_on_top(redis_url: str) -> None:
    # given an operation timeout far shorter than a BLPOP's block time
    # (a margin a loaded CI machine's scheduling cannot eat)
    client = RedisClient(dataclasses.replace(RedisSettings.from_url(redis_url), timeout_s=0.5))
    try:
        # then the BLPOP ends with Redis's own answer (nothing came), not with a timeout
        assert await client.blpop(["empty"], 1.5) is None
        assert await client.xread({"no-stream": "0-0"}, block_ms=1500) == []
    finally:
        await client.aclose()


async def test_authentication_is_bounded_by_the_connect_timeout(silent: tuple[FakeRedis, int]) -> None:
    # given a server that accepts the connection but never answers AUTH
    fake, port = silent
    link = RedisLink(RedisSettings.from_url(f"redis://:pw@127.0.0.1:{port}?socket_connect_timeout=0.2"))
    try:
        with pytest.raises(RedisConnectionError, match="cannot connect"):
            await link.execute("PING")
        assert fake.commands == [[b"AUTH", b"pw"]]
    finally:
        await link.aclose()


async def test_a_connection_authenticates_and_selects_its_db(answering: tuple[FakeRedis, int]) -> None:
    fake, port = answering
    link = RedisLink(RedisSettings.from_url(f"redis://user:pw@127.0.0.1:{port}/3"))
    try:
        assert await link.execute("PING") == b"PONG"
        assert fake.commands == [[b"AUTH", b"user", b"pw"], [b"SELECT", b"3"], [b"PING"]]
    finally:
        await link.aclose()


async def test_an_idle_connection_is_checked_with_a_ping(answering: tuple[FakeRedis, int]) -> None:
    # given a connection idle after its first command, with a 0.1 s health check interval
    fake, port = answering
    link = RedisLink(RedisSettings.from_url(f"redis://127.0.0.1:{port}?health_check_interval=0.1"))
    try:
        await link.execute("GET", "k")
        # then the link PINGs it, again and again while it stays idle
        await asyncio.wait_for(fake.seen(lambda _: fake.count(b"PING") >= 2), timeout=30)
    finally:
        await link.aclose()


async def test_a_health_check_left_unanswered_drops_the_connection(silent: tuple[FakeRedis, int]) -> None:
    # given a connection whose server stops answering (here: never answered), no socket_timeout
    fake, port = silent
    link = RedisLink(RedisSettings.from_url(f"redis://127.0.0.1:{port}?health_check_interval=0.1"))
    try:
        # when a command waits past the health interval, then it fails like an outage
        with pytest.raises(RedisTimeoutError):
            await asyncio.wait_for(link.execute("GET", "k"), timeout=30)
    finally:
        await link.aclose()


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[FakeRedis, int, Path]]:
    """A TLS server whose certificate names `redis.test` and 127.0.0.1 (not `localhost`)."""
    files = make_tls_files(tmp_path, host="redis.test")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.server_cert, files.server_key)
    fake = FakeRedis()
    server, port = await _serve(fake, context)
    yield fake, port, files.ca
    server.close()


async def test_tls_checks_the_host_name_by_default(tls_server: tuple[FakeRedis, int, Path]) -> None:
    # given a server certificate that does not name `localhost`
    _, port, ca = tls_server
    wrong_name = RedisLink(RedisSettings.from_url(f"rediss://localhost:{port}?ssl_ca_certs={ca}"))
    right_name = RedisLink(RedisSettings.from_url(f"rediss://127.0.0.1:{port}?ssl_ca_certs={ca}"))
    unchecked = RedisLink(RedisSettings.from_url(
        f"rediss://localhost:{port}?ssl_ca_certs={ca}&ssl_check_hostname=false"))
    try:
        # then reaching it as `localhost` fails, as its own address works, and so does opting out
        with pytest.raises(RedisConnectionError, match="cannot connect"):
            await wrong_name.execute("PING")
        assert await right_name.execute("PING") == b"PONG"
        assert await unchecked.execute("PING") == b"PONG"
    finally:
        for link in (wrong_name, right_name, unchecked):
            await link.aclose()


async def test_tls_refuses_a_server_signed_by_another_ca(tls_server: tuple[FakeRedis, int, Path]) -> None:
    _, port, _ = tls_server
    link = RedisLink(RedisSettings.from_url(f"rediss://127.0.0.1:{port}"))  # the system's CAs only
    try:
        with pytest.raises(RedisConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await link.execute("PING")
    finally:
        await link.aclose()
