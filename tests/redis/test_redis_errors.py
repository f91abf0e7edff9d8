"""The error map: each Redis error reply raised as redis-py raises it, checked against redis-py
itself on a real server where the error can be provoked, and against redis-py's documented
classes where it cannot (LOADING, READONLY, ...)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ExecAbortError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from common.redis.client import RedisClient
from common.redis.errors import OUTAGE, reply_error


@pytest.mark.parametrize(("reply", "expected"), [
    ("LOADING Redis is loading the dataset in memory", BusyLoadingError),
    ("NOSCRIPT No matching script. Please use EVAL.", NoScriptError),
    ("OOM command not allowed when used memory > 'maxmemory'.", OutOfMemoryError),
    ("READONLY You can't write against a read only replica.", ReadOnlyError),
    ("WRONGPASS invalid username-password pair or user is disabled.", AuthenticationError),
    ("NOAUTH Authentication required.", AuthenticationError),
    ("NOPERM this user has no permissions to run the 'set' command", NoPermissionError),
    ("EXECABORT Transaction discarded because of previous errors.", ExecAbortError),
    ("ERR max number of clients reached", RedisConnectionError),
    ("ERR invalid password", AuthenticationError),
    ("ERR Client sent AUTH, but no password is set", AuthenticationError),
    ("ERR wrong number of arguments for 'auth' command", AuthenticationWrongNumberOfArgsError),
    ("ERR unknown command 'NOPE'", ResponseError),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", ResponseError),
])
def test_each_reply_gets_redis_py_class(reply: str, expected: type[RedisError]) -> None:
    error = reply_error(reply)
    assert type(error) is expected


def test_loading_is_an_outage_and_the_text_after_the_code_is_kept() -> None:
    # a restarted Redis reading its AOF: retried like an outage (the API's 503), not a 500
    loading = reply_error("LOADING Redis is loading the dataset in memory")
    assert isinstance(loading, OUTAGE)
    assert str(loading) == "Redis is loading the dataset in memory"


def test_a_script_write_refused_at_maxmemory_is_out_of_memory_on_6_2_as_on_7() -> None:
    # Redis 6.2 wraps the refusal of a script's write in its script error; 7 answers OOM itself
    wrapped = reply_error("ERR Error running script (call to f_0a1b): @user_script:12: "
                          "@user_script: 12: -OOM command not allowed when used memory > 'maxmemory'.")
    assert type(wrapped) is OutOfMemoryError and "-OOM command not allowed" in str(wrapped)
    other = reply_error("ERR Error running script (call to f_0a1b): @user_script:1: bad")
    assert type(other) is ResponseError


Call = Callable[[Any], Awaitable[Any]]

#: Errors a real server gives on demand: (name, redis-py call, the same with the fleet's client).
PROVOKED: list[tuple[str, Call, Call]] = [
    ("noscript", lambda r: r.evalsha("0" * 40, 0), lambda c: c.execute("EVALSHA", "0" * 40, 0)),
    ("wrongtype", lambda r: r.hgetall("a-string"), lambda c: c.hgetall("a-string")),
    ("syntax", lambda r: r.xrange("stream", min="not-an-id"), lambda c: c.xrange("stream", min="not-an-id")),
    ("unknown", lambda r: r.execute_command("NOPE"), lambda c: c.execute("NOPE")),
    ("script", lambda r: r.eval("return redis.error_reply('MYERR custom')", 0),
     lambda c: c.execute("EVAL", "return redis.error_reply('MYERR custom')", 0)),
]


@pytest.mark.parametrize(("name", "with_redis_py", "with_client"), PROVOKED, ids=[p[0] for p in PROVOKED])
async def test_errors_of_a_real_server_match_redis_py(
    redis_client: aioredis.Redis, fleet_redis: RedisClient, name: str, with_redis_py: Call, with_client: Call,
) -> None:
    await redis_client.set("a-string", "text")
    with pytest.raises(RedisError) as by_redis_py:
        await with_redis_py(redis_client)
    with pytest.raises(RedisError) as by_client:
        await with_client(fleet_redis)
    assert type(by_client.value) is type(by_redis_py.value)
    assert str(by_client.value) == str(by_redis_py.value)


async def test_a_wrong_password_is_an_authentication_error(redis_url: str) -> None:
    settings_url = redis_url.replace("://:", "://:wrong", 1) if "://:" in redis_url else None
    if settings_url is None:
        pytest.skip("the test Redis has no password")
    client = RedisClient.from_url(settings_url)
    try:
        with pytest.raises(AuthenticationError):
            await client.ping()
    finally:
        await client.aclose()
