"""RedisClient on a real Redis, each command's answer held to redis-py's for the same command
(redis-py is the second implementation), then what only the client does: blocking commands on
connections of their own, and `aclose`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from common.redis.client import RedisClient
from common.redis.settings import RedisSettings

Call = Callable[[Any], Awaitable[Any]]


async def _seed(r: aioredis.Redis) -> None:
    await r.hset("h", mapping={"a": "1", "b": "two", "é": "ü"})
    await r.rpush("l", "x", "y", "z")
    await r.zadd("z", {"m1": 1, "m2": 2.5, "m3": 3})
    await r.zadd("lex", {"a": 0, "b": 0, "c": 0, "d": 0})
    await r.set("s", "value")
    await r.pexpire("s", 60_000)
    for i in range(5):
        await r.xadd("st", {"n": str(i), "k": "v"}, id=f"{i + 1}-0")
    await r.xgroup_create("st", "g", id="0")


#: Reads: (name, redis-py call, the client's call); both must answer the same.
READS: list[tuple[str, Call, Call]] = [
    ("ping", lambda r: r.ping(), lambda c: c.ping()),
    ("get", lambda r: r.get("s"), lambda c: c.get("s")),
    ("get missing", lambda r: r.get("nope"), lambda c: c.get("nope")),
    ("exists", lambda r: r.exists("s", "h", "nope"), lambda c: c.exists("s", "h", "nope")),
    ("hgetall", lambda r: r.hgetall("h"), lambda c: c.hgetall("h")),
    ("hgetall missing", lambda r: r.hgetall("nope"), lambda c: c.hgetall("nope")),
    ("hget", lambda r: r.hget("h", "é"), lambda c: c.hget("h", "é")),
    ("hmget", lambda r: r.hmget("h", ["a", "nope", "b"]), lambda c: c.hmget("h", ["a", "nope", "b"])),
    ("hlen", lambda r: r.hlen("h"), lambda c: c.hlen("h")),
    ("lindex", lambda r: r.lindex("l", 1), lambda c: c.lindex("l", 1)),
    ("lindex past end", lambda r: r.lindex("l", 9), lambda c: c.lindex("l", 9)),
    ("lrange", lambda r: r.lrange("l", 0, -1), lambda c: c.lrange("l", 0, -1)),
    ("llen", lambda r: r.llen("l"), lambda c: c.llen("l")),
    ("zcard", lambda r: r.zcard("z"), lambda c: c.zcard("z")),
    ("zrange", lambda r: r.zrange("z", 0, -1), lambda c: c.zrange("z", 0, -1)),
    ("zrange withscores", lambda r: r.zrange("z", 0, 1, withscores=True),
     lambda c: c.zrange_withscores("z", 0, 1)),
    ("zrevrange", lambda r: r.zrevrange("z", 0, 1), lambda c: c.zrevrange("z", 0, 1)),
    ("zrangebylex", lambda r: r.zrangebylex("lex", "(a", "+", start=0, num=2),
     lambda c: c.zrangebylex("lex", "(a", "+", start=0, num=2)),
    ("zrevrangebyscore", lambda r: r.zrevrangebyscore("z", "(3", "-inf", start=0, num=5),
     lambda c: c.zrevrangebyscore("z", "(3", "-inf", start=0, num=5)),
    ("zrank", lambda r: r.zrank("z", "m2"), lambda c: c.zrank("z", "m2")),
    ("zrank missing", lambda r: r.zrank("z", "nope"), lambda c: c.zrank("z", "nope")),
    ("zscore", lambda r: r.zscore("z", "m2"), lambda c: c.zscore("z", "m2")),
    ("xlen", lambda r: r.xlen("st"), lambda c: c.xlen("st")),
    ("xrange", lambda r: r.xrange("st"), lambda c: c.xrange("st")),
    ("xrange after", lambda r: r.xrange("st", min="(2-0", count=2),
     lambda c: c.xrange("st", min="(2-0", count=2)),
    ("xrevrange", lambda r: r.xrevrange("st", max="(5-0", min="-", count=2),
     lambda c: c.xrevrange("st", max="(5-0", min="-", count=2)),
    ("xread", lambda r: r.xread({"st": "3-0"}, count=10), lambda c: c.xread({"st": "3-0"}, count=10)),
    ("xread nothing", lambda r: r.xread({"st": "5-0"}), lambda c: c.xread({"st": "5-0"})),
    ("xinfo_groups", lambda r: r.xinfo_groups("st"), lambda c: c.xinfo_groups("st")),
    ("scan", lambda r: r.scan(0, match="h*", count=1000), lambda c: c.scan(0, match="h*", count=1000)),
]


@pytest.mark.parametrize(("name", "with_redis_py", "with_client"), READS, ids=[r[0] for r in READS])
async def test_reads_answer_as_redis_py(
    redis_client: aioredis.Redis, fleet_redis: RedisClient, name: str, with_redis_py: Call, with_client: Call,
) -> None:
    await _seed(redis_client)
    expected = await with_redis_py(redis_client)
    got = await with_client(fleet_redis)
    if isinstance(expected, list) and name == "xread":
        expected = [(stream, entries) for stream, entries in expected]
    if name == "scan":
        expected = (expected[0], sorted(expected[1]))
        got = (got[0], sorted(got[1]))
    assert got == expected


#: Writes: (name, redis-py call, the client's call, how to read the result back); applied to two
#: copies of the same data, the read-backs must be equal and so must the replies.
WRITES: list[tuple[str, Call, Call, Call]] = [
    ("set", lambda r: r.set("k", "v"), lambda c: c.set("k", "v"), lambda r: r.get("k")),
    ("delete", lambda r: r.delete("s", "nope"), lambda c: c.delete("s", "nope"), lambda r: r.exists("s")),
    ("expire", lambda r: r.expire("s", 100), lambda c: c.expire("s", 100),
     lambda r: _expires_within(r, "s", 100)),
    ("hset", lambda r: r.hset("h", mapping={"a": "9", "c": 3}), lambda c: c.hset("h", {"a": "9", "c": 3}),
     lambda r: r.hgetall("h")),
    ("hincrby", lambda r: r.hincrby("h", "a", 5), lambda c: c.hincrby("h", "a", 5),
     lambda r: r.hget("h", "a")),
    ("lpush", lambda r: r.lpush("l", "p", "q"), lambda c: c.lpush("l", "p", "q"),
     lambda r: r.lrange("l", 0, -1)),
    ("ltrim", lambda r: r.ltrim("l", 0, 1), lambda c: c.ltrim("l", 0, 1), lambda r: r.lrange("l", 0, -1)),
    ("zadd", lambda r: r.zadd("z", {"m4": 4, "m1": 0.5}), lambda c: c.zadd("z", {"m4": 4, "m1": 0.5}),
     lambda r: r.zrange("z", 0, -1, withscores=True)),
    ("zrem", lambda r: r.zrem("z", "m1", "nope"), lambda c: c.zrem("z", "m1", "nope"),
     lambda r: r.zrange("z", 0, -1)),
    ("zremrangebyrank", lambda r: r.zremrangebyrank("z", 0, -3), lambda c: c.zremrangebyrank("z", 0, -3),
     lambda r: r.zrange("z", 0, -1)),
    ("zremrangebyscore", lambda r: r.zremrangebyscore("z", "-inf", 2.5),
     lambda c: c.zremrangebyscore("z", "-inf", 2.5), lambda r: r.zrange("z", 0, -1)),
    ("xdel", lambda r: r.xdel("st", "2-0", "9-0"), lambda c: c.xdel("st", "2-0", "9-0"),
     lambda r: r.xrange("st")),
    ("xtrim", lambda r: r.xtrim("st", minid="3-0", approximate=False),
     lambda c: c.xtrim("st", "3-0", approximate=False), lambda r: r.xrange("st")),
    ("xack", lambda r: r.xack("st", "g", "1-0"), lambda c: c.xack("st", "g", "1-0"),
     lambda r: r.xpending("st", "g")),
    ("xgroup_create", lambda r: r.xgroup_create("new", "g2", id="0", mkstream=True),
     lambda c: c.xgroup_create("new", "g2", id="0", mkstream=True), lambda r: r.xinfo_groups("new")),
    ("publish", lambda r: r.publish("chan", "hello"), lambda c: c.publish("chan", "hello"),
     lambda r: r.exists("chan")),
]


@pytest.mark.parametrize(("name", "with_redis_py", "with_client", "read_back"), WRITES,
                         ids=[w[0] for w in WRITES])
async def test_writes_do_what_redis_py_does(
    redis_url: str, redis_client: aioredis.Redis, fleet_redis: RedisClient, name: str,
    with_redis_py: Call, with_client: Call, read_back: Call,
) -> None:
    # given the same data in db 0 (redis-py) and db 1 (the client)
    other = aioredis.Redis(connection_pool=_db(redis_url, 1).connection_pool())
    client = RedisClient(_db(redis_url, 1))
    try:
        await other.flushdb()
        for r in (redis_client, other):
            await _seed(r)
        if name == "xack":
            for r in (redis_client, other):
                await r.xreadgroup("g", "c", {"st": ">"})
        # when each applies the write
        replies = await with_redis_py(redis_client), await with_client(client)
        # then both answer alike and leave the same data
        assert replies[1] == replies[0]
        assert await read_back(other) == await read_back(redis_client)
    finally:
        await other.flushdb()
        await other.aclose()
        await client.aclose()


def _db(url: str, db: int) -> RedisSettings:
    return dataclasses.replace(RedisSettings.from_url(url), db=db)


async def _expires_within(r: aioredis.Redis, key: str, seconds: int) -> bool:
    return 0 < await r.ttl(key) <= seconds


async def test_xadd_with_a_cap_and_xreadgroup_and_xautoclaim_as_redis_py(
    redis_client: aioredis.Redis, fleet_redis: RedisClient,
) -> None:
    for i in range(10):
        await fleet_redis.xadd("capped", {"i": i}, maxlen=3, approximate=False)
    assert await fleet_redis.xrange("capped") == await redis_client.xrange("capped")
    assert [f[b"i"] for _, f in await fleet_redis.xrange("capped")] == [b"7", b"8", b"9"]
    await fleet_redis.xgroup_create("capped", "g", id="0")
    read = await fleet_redis.xreadgroup("g", "c1", {"capped": ">"}, count=2)
    assert read == [(b"capped", (await redis_client.xrange("capped"))[:2])]
    by_redis_py = await redis_client.xautoclaim("capped", "g", "c2", 0, start_id="0-0", count=10)
    by_client = await fleet_redis.xautoclaim("capped", "g", "c3", 0, start_id="0-0", count=10)
    assert by_client[0] == by_redis_py[0] and by_client[1] == by_redis_py[1]


@pytest.mark.parametrize("section", ["memory", "cpu", "clients", "keyspace", "server"])
async def test_info_is_parsed_as_redis_py_parses_it(
    redis_client: aioredis.Redis, fleet_redis: RedisClient, section: str,
) -> None:
    await redis_client.set("k", "v")
    expected, got = await redis_client.info(section), await fleet_redis.info(section)
    # values move between the two calls (memory, CPU): their names and kinds must match
    assert got.keys() == expected.keys()
    assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}
    assert got.get("db0") == expected.get("db0")


async def test_commands_issued_together_keep_their_order(fleet_redis: RedisClient) -> None:
    # what replaced redis-py pipelines: calls made in one loop turn leave in one write, in order
    replies = await asyncio.gather(*(fleet_redis.hincrby("counter", "n", 1) for _ in range(200)))
    assert replies == list(range(1, 201))


async def test_a_blocked_read_does_not_hold_up_other_commands(fleet_redis: RedisClient) -> None:
    # given a BLPOP waiting on an empty list
    blocked = asyncio.create_task(fleet_redis.blpop(["inbox"], 0))
    # when other commands run meanwhile, then they are answered (the BLPOP has a connection of its own)
    assert await fleet_redis.ping()
    assert await fleet_redis.lpush("inbox", "item") == 1
    assert await blocked == (b"inbox", b"item")


async def test_blpop_times_out_with_none_and_reuses_its_connection(fleet_redis: RedisClient) -> None:
    assert await fleet_redis.blpop(["empty"], 0.05) is None
    await fleet_redis.lpush("full", "a")
    assert await fleet_redis.blpop(["empty", "full"], 1) == (b"full", b"a")


async def test_a_cancelled_blpop_takes_nothing(fleet_redis: RedisClient, redis_client: aioredis.Redis,
                                               ) -> None:
    # given a BLPOP cancelled while it waits
    blocked = asyncio.create_task(fleet_redis.blpop(["inbox"], 0))
    while not await _blocked_clients(redis_client):
        await asyncio.sleep(0.01)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    # when an item is pushed afterwards, then it stays for the next reader (its connection was closed)
    while await _blocked_clients(redis_client):
        await asyncio.sleep(0.01)
    await fleet_redis.lpush("inbox", "kept")
    assert await fleet_redis.lrange("inbox", 0, -1) == [b"kept"]


async def _blocked_clients(r: aioredis.Redis) -> int:
    return int((await r.info("clients"))["blocked_clients"])


async def test_a_blocking_xread_waits_for_the_entry(fleet_redis: RedisClient) -> None:
    reading = asyncio.create_task(fleet_redis.xread({"out": "0-0"}, count=10, block_ms=0))
    entry_id = await fleet_redis.xadd("out", {"data": "x"})
    assert await reading == [(b"out", [(entry_id, {b"data": b"x"})])]
    assert await fleet_redis.xread({"out": entry_id}, block_ms=10) == []


async def test_past_max_blocking_a_blocked_call_is_refused_as_an_outage(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url, max_blocking=1)
    try:
        first = asyncio.create_task(client.blpop(["a"], 0))
        await asyncio.sleep(0)  # the first takes the one connection allowed
        with pytest.raises(RedisConnectionError, match="max_blocking=1"):
            await client.blpop(["b"], 0)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
    finally:
        await client.aclose()


async def test_aclose_ends_blocked_calls(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url)
    blocked = asyncio.create_task(client.blpop(["never"], 0))
    assert await client.ping()
    await client.aclose()
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(blocked, 5)


async def test_aclose_just_after_a_blocking_call_connected_ends_that_call(redis_url: str) -> None:
    # The connect is done but the call waiting for it has not run yet: the connection it is about
    # to use is one `aclose` must close too (else the call blocks on it forever).
    client = RedisClient.from_url(redis_url)
    blocked = asyncio.create_task(client.blpop(["never"], 0))
    await asyncio.sleep(0)
    [link] = client._busy_blocking
    while link._connecting is None or not link._connecting.done():
        await asyncio.sleep(0)
    await client.aclose()
    with pytest.raises(RedisConnectionError):
        await asyncio.wait_for(blocked, 5)


@pytest.mark.parametrize("timeout_s", [0.0001, 0.001, 0.0015, 0.002, 0.01])
async def test_a_blpop_of_a_millisecond_or_less_times_out_instead_of_blocking_forever(
    fleet_redis: RedisClient, timeout_s: float
) -> None:
    # Redis 6.2 read a timeout of "0.001" as 0.999... ms, truncated to 0: block forever.
    assert await asyncio.wait_for(fleet_redis.blpop(["nothing-comes"], timeout_s), 5) is None


async def test_aclose_while_a_call_connects_fails_that_call_instead_of_cancelling_it(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url)
    blocked = asyncio.create_task(client.blpop(["never"], 0))
    plain = asyncio.create_task(client.get("k"))
    await asyncio.sleep(0)  # both wait for their connects
    await client.aclose()
    for call in (blocked, plain):
        with pytest.raises(RedisConnectionError):
            await call


async def test_listen_gets_what_publish_sends(fleet_redis: RedisClient) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    subscribed = asyncio.Event()

    async def on_subscribed() -> None:
        subscribed.set()

    listening = asyncio.create_task(fleet_redis.listen("news", got.put_nowait, on_subscribed))
    await subscribed.wait()
    assert await fleet_redis.publish("news", "héllo") == 1
    assert await got.get() == "héllo"
    listening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await listening
