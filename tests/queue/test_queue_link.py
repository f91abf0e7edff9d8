"""RedisLink on real Redis: order, errors, reconnects (script reload: tests/redis/test_redis_scripts.py)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError, NoScriptError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from common.embedded_redis import redis_server_binary
from common.event_loop import run_network_role
from common.redis.errors import reply_error
from common.redis.link import Encoded, RedisLink, encode_command
from common.redis.settings import RedisSettings


def test_encode_command_is_resp_bulk_strings() -> None:
    assert encode_command(("SET", "k", b"v\r\n", 3, 1.5)) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$1\r\n3\r\n$3\r\n1.5\r\n")


def test_an_encoded_run_is_sent_as_its_arguments() -> None:
    # a script's fleet-wide keys, laid out once: the same bytes as the keys one by one
    run = Encoded(("af:ready", "af:sess:{env/é}"))
    assert encode_command(("EVALSHA", "ab", 2, run, 7)) == encode_command(
        ("EVALSHA", "ab", 2, "af:ready", "af:sess:{env/é}", 7))
    assert encode_command(("X", run, b"\xff", 1.5)) == encode_command(
        ("X", "af:ready", "af:sess:{env/é}", b"\xff", 1.5))


def test_error_replies_are_raised_as_redis_py_raises_them() -> None:
    # a restarted Redis reading its AOF answers LOADING: an outage to retry (the API's 503), not
    # an unexpected error (a 500); NOSCRIPT makes the script registry load the script
    loading = reply_error("LOADING Redis is loading the dataset in memory")
    assert isinstance(loading, BusyLoadingError) and isinstance(loading, RedisConnectionError)
    assert isinstance(reply_error("NOSCRIPT No matching script."), NoScriptError)
    other = reply_error("ERR Error running script")
    assert type(other) is ResponseError and "Error running script" in str(other)


def test_encode_command_counts_bytes_not_characters() -> None:
    # ASCII text and ints take the one-string path; non-ASCII text is sized in UTF-8 bytes
    assert encode_command(("EVALSHA", "ab", 0, -7)) == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n$2\r\n-7\r\n")
    assert encode_command(("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"


async def test_concurrent_commands_get_their_own_replies_in_order(redis_url: str) -> None:
    link = RedisLink(RedisSettings.from_url(redis_url))
    try:
        replies = await asyncio.gather(*(link.execute("INCR", f"k{i % 7}") for i in range(700)))
        values = await asyncio.gather(*(link.execute("GET", f"k{i}") for i in range(7)))
        echoed = await asyncio.gather(*(link.execute("ECHO", f"e{i}") for i in range(300)))
    finally:
        await link.aclose()
    assert [r for i, r in enumerate(replies) if i % 7 == 0] == list(range(1, 101))
    assert values == [b"100"] * 7
    assert echoed == [f"e{i}".encode() for i in range(300)]


async def test_error_replies_raise_and_do_not_shift_later_replies(redis_url: str) -> None:
    link = RedisLink(RedisSettings.from_url(redis_url))
    try:
        await link.execute("SET", "s", "text")
        bad, good = await asyncio.gather(link.execute("INCR", "s"), link.execute("GET", "s"),
                                         return_exceptions=True)
    finally:
        await link.aclose()
    assert isinstance(bad, ResponseError) and good == b"text"


async def test_a_cancelled_caller_does_not_take_the_next_reply(redis_url: str) -> None:
    link = RedisLink(RedisSettings.from_url(redis_url))
    try:
        await link.execute("PING")
        slow = asyncio.ensure_future(link.execute("BLPOP", "nothing", 0.2))
        await asyncio.sleep(0.05)
        slow.cancel()
        assert await link.execute("ECHO", "after") == b"after"
    finally:
        await link.aclose()


async def test_a_killed_connection_fails_in_flight_calls_and_the_next_reconnects(
    redis_client: aioredis.Redis, redis_url: str,
) -> None:
    link = RedisLink(RedisSettings.from_url(redis_url))
    try:
        await link.execute("CLIENT", "SETNAME", "link-under-test")
        blocked = asyncio.ensure_future(link.execute("BLPOP", "never", 10))
        await asyncio.sleep(0.05)
        await redis_client.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        with pytest.raises(RedisConnectionError):
            await blocked
        assert await link.execute("PING") == b"PONG"
    finally:
        await link.aclose()


def test_the_link_runs_on_uvloop(redis_url: str) -> None:
    """The roles that use it run on uvloop (common.event_loop), whose transports differ."""

    async def main() -> list[object]:
        link = RedisLink(RedisSettings.from_url(redis_url))
        try:
            return list(await asyncio.gather(link.execute("PING"), link.execute("ECHO", "uv")))
        finally:
            await link.aclose()

    assert run_network_role(main()) == [b"PONG", b"uv"]


async def test_listen_hands_over_messages_and_raises_when_the_connection_drops(
    redis_client: aioredis.Redis, redis_url: str,
) -> None:
    link = RedisLink(RedisSettings.from_url(redis_url))
    got: list[str] = []
    subscribed = asyncio.Event()

    async def on_subscribed() -> None:
        subscribed.set()

    listener = asyncio.ensure_future(link.listen("chan", got.append, on_subscribed))
    try:
        await asyncio.wait_for(subscribed.wait(), 5)
        for i in range(50):
            await redis_client.publish("chan", f"m{i} é")
        await redis_client.publish("other", "not for us")
        deadline = asyncio.get_running_loop().time() + 5
        while len(got) < 50 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert got == [f"m{i} é" for i in range(50)]
        await redis_client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(listener, 5)
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await link.aclose()


async def test_unix_socket_url_with_a_db(tmp_path: Path) -> None:
    """`redis.url: unix:///path?db=N` reaches the same server and database through the link."""
    sock = tmp_path / "redis.sock"
    server = subprocess.Popen([redis_server_binary(), "--port", "0", "--unixsocket", str(sock),
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    client = aioredis.Redis.from_url(f"unix://{sock}?db=3")
    link = RedisLink(RedisSettings.from_url(f"unix://{sock}?db=3"))
    try:
        async with asyncio.timeout(10):
            while not sock.exists():
                await asyncio.sleep(0.01)
        await link.execute("SET", "k", "through the link")
        assert await client.get("k") == b"through the link"  # redis-py, same db 3
        assert await link.execute("CLIENT", "LIST")  # the connection works for any command
    finally:
        await link.aclose()
        await client.aclose()
        server.terminate()
        server.wait(10)
