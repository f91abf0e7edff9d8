"""RedisClient: the fleet's one client of Redis, one per process role, opened at start.

Every command goes over the pipelined link (`common.redis.link`): commands issued in the same
loop iteration leave in one write, so "pipelines" are simply concurrent calls
(`asyncio.gather`). Commands that block (BLPOP, XREAD and XREADGROUP with BLOCK) go over
connections of their own, one per blocked caller, so they never hold up the pipelined one;
past `max_blocking` of them a call fails with ConnectionError (an outage to the caller: the
API answers 503). Pub/sub listens on a connection of its own too (`listen`).

Methods are named after their commands and answer as redis-py answers (with
`decode_responses=False`): bytes for values, ints for counts, dicts for hashes, (id, fields)
pairs for stream entries; tests/redis/test_redis_client.py holds each to redis-py's answer.
Errors are redis-py's classes (`common.redis.errors`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from common.redis.errors import connection_failed
from common.redis.link import RedisArg, RedisLink
from common.redis.settings import RedisSettings

#: Blocked callers per process by default (each holds a connection while it waits).
DEFAULT_MAX_BLOCKING = 1024

Fields = dict[bytes, bytes]
#: A stream entry: its id and fields.
StreamEntry = tuple[bytes, Fields]
#: What XAUTOCLAIM claims: entries, or (None, None) for one trimmed away meanwhile (Redis 6.2).
ClaimedEntry = StreamEntry | tuple[None, None]


class RedisClient:
    """Typed commands over one pipelined link, blocking ones on connections of their own."""

    def __init__(self, settings: RedisSettings, max_blocking: int = DEFAULT_MAX_BLOCKING) -> None:
        self.settings = settings
        self.link = RedisLink(settings)
        #: A command over the pipelined link, answered as Redis answers (for the script registry
        #: and for commands without a method here); the link's own method: no extra await per call.
        self.execute: Callable[..., Awaitable[Any]] = self.link.execute
        self._max_blocking = max_blocking
        self._idle_blocking: list[RedisLink] = []
        self._busy_blocking: set[RedisLink] = set()

    @classmethod
    def from_url(cls, url: str, max_blocking: int = DEFAULT_MAX_BLOCKING) -> RedisClient:
        """Raises RedisSettingsError naming what the URL gets wrong."""
        return cls(RedisSettings.from_url(url), max_blocking)

    async def __aenter__(self) -> RedisClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection; blocked callers get ConnectionError."""
        links = [self.link, *self._idle_blocking, *self._busy_blocking]
        self._idle_blocking.clear()
        self._busy_blocking.clear()
        for link in links:
            await link.aclose()

    async def execute_blocking(self, block_s: float, *args: RedisArg) -> Any:
        """A command that may block up to `block_s`, on a connection no other caller is using."""
        if self._idle_blocking:
            link = self._idle_blocking.pop()
        elif len(self._busy_blocking) < self._max_blocking:
            link = RedisLink(self.settings)
        else:
            raise connection_failed(f"too many blocked Redis calls (max_blocking={self._max_blocking})")
        self._busy_blocking.add(link)
        try:
            reply = await link.execute_blocking(block_s, *args)
        except BaseException:
            # Cancelled or failed mid-block: the connection may still owe a reply; drop it.
            self._busy_blocking.discard(link)
            await link.aclose()
            raise
        self._busy_blocking.discard(link)
        self._idle_blocking.append(link)
        return reply

    async def listen(self, channel: str, on_message: Callable[[str], None],
                     on_subscribed: Callable[[], Awaitable[None]] | None = None) -> None:
        """Subscribe on a connection of its own (see `RedisLink.listen`); raises when it drops."""
        await self.link.listen(channel, on_message, on_subscribed)

    # -- server and scripts ------------------------------------------------------------------------
    async def ping(self) -> bool:
        return bool(await self.link.execute("PING") == b"PONG")

    async def info(self, section: str) -> dict[str, Any]:
        """INFO `section` by field: numbers as int or float, `k=v,...` values (db0) as dicts."""
        raw = bytes(await self.link.execute("INFO", section)).decode()
        fields = (line.split(":", 1) for line in raw.splitlines() if line and not line.startswith("#"))
        return {name: _info_value(value) for name, value in fields}

    async def publish(self, channel: str, message: RedisArg) -> int:
        return int(await self.link.execute("PUBLISH", channel, message))

    async def scan(self, cursor: int = 0, match: str | None = None, count: int | None = None
                   ) -> tuple[int, list[bytes]]:
        reply = await self.link.execute("SCAN", cursor, *_opt("MATCH", match), *_opt("COUNT", count))
        return int(reply[0]), list(reply[1])

    # -- keys and strings --------------------------------------------------------------------------
    async def get(self, name: str) -> bytes | None:
        value: bytes | None = await self.link.execute("GET", name)
        return value

    async def set(self, name: str, value: RedisArg) -> bool:
        return bool(await self.link.execute("SET", name, value) == b"OK")

    async def exists(self, *names: str) -> int:
        return int(await self.link.execute("EXISTS", *names))

    async def delete(self, *names: str) -> int:
        return int(await self.link.execute("DEL", *names))

    async def expire(self, name: str, seconds: int) -> bool:
        return bool(await self.link.execute("EXPIRE", name, seconds))

    async def pttl(self, name: str) -> int:
        return int(await self.link.execute("PTTL", name))

    # -- hashes ------------------------------------------------------------------------------------
    async def hgetall(self, name: str) -> Fields:
        return _pairs(await self.link.execute("HGETALL", name))

    async def hget(self, name: str, key: str) -> bytes | None:
        value: bytes | None = await self.link.execute("HGET", name, key)
        return value

    async def hmget(self, name: str, keys: Sequence[str]) -> list[bytes | None]:
        return list(await self.link.execute("HMGET", name, *keys))

    async def hset(self, name: str, mapping: Mapping[str, RedisArg]) -> int:
        flat = [part for item in mapping.items() for part in item]
        return int(await self.link.execute("HSET", name, *flat))

    async def hincrby(self, name: str, key: str, amount: int = 1) -> int:
        return int(await self.link.execute("HINCRBY", name, key, amount))

    async def hlen(self, name: str) -> int:
        return int(await self.link.execute("HLEN", name))

    # -- lists -------------------------------------------------------------------------------------
    async def lindex(self, name: str, index: int) -> bytes | None:
        value: bytes | None = await self.link.execute("LINDEX", name, index)
        return value

    async def lrange(self, name: str, start: int, end: int) -> list[bytes]:
        return list(await self.link.execute("LRANGE", name, start, end))

    async def llen(self, name: str) -> int:
        return int(await self.link.execute("LLEN", name))

    async def lpush(self, name: str, *values: RedisArg) -> int:
        return int(await self.link.execute("LPUSH", name, *values))

    async def ltrim(self, name: str, start: int, end: int) -> bool:
        return bool(await self.link.execute("LTRIM", name, start, end) == b"OK")

    async def blpop(self, keys: Sequence[str], timeout_s: float) -> tuple[bytes, bytes] | None:
        """The first element pushed to any of `keys` within `timeout_s` (0: forever), or None."""
        reply = await self.execute_blocking(timeout_s, "BLPOP", *keys, _block_timeout(timeout_s))
        return None if reply is None else (reply[0], reply[1])

    # -- sorted sets -------------------------------------------------------------------------------
    async def zcard(self, name: str) -> int:
        return int(await self.link.execute("ZCARD", name))

    async def zrange(self, name: str, start: int, end: int) -> list[bytes]:
        return list(await self.link.execute("ZRANGE", name, start, end))

    async def zrange_withscores(self, name: str, start: int, end: int) -> list[tuple[bytes, float]]:
        return _scored(await self.link.execute("ZRANGE", name, start, end, "WITHSCORES"))

    async def zrevrange(self, name: str, start: int, end: int) -> list[bytes]:
        return list(await self.link.execute("ZREVRANGE", name, start, end))

    async def zrangebylex(self, name: str, low: str, high: str, start: int | None = None,
                          num: int | None = None) -> list[bytes]:
        return list(await self.link.execute("ZRANGEBYLEX", name, low, high, *_limit(start, num)))

    async def zrevrangebyscore(self, name: str, high: RedisArg, low: RedisArg, start: int | None = None,
                               num: int | None = None) -> list[bytes]:
        return list(await self.link.execute("ZREVRANGEBYSCORE", name, high, low, *_limit(start, num)))

    async def zcount(self, name: str, low: RedisArg, high: RedisArg) -> int:
        return int(await self.link.execute("ZCOUNT", name, low, high))

    async def zrank(self, name: str, member: str) -> int | None:
        rank: int | None = await self.link.execute("ZRANK", name, member)
        return rank

    async def zscore(self, name: str, member: str) -> float | None:
        score = await self.link.execute("ZSCORE", name, member)
        return None if score is None else float(score)

    async def zadd(self, name: str, mapping: Mapping[str, float | int]) -> int:
        flat = [part for member, score in mapping.items() for part in (score, member)]
        return int(await self.link.execute("ZADD", name, *flat))

    async def zrem(self, name: str, *members: str) -> int:
        return int(await self.link.execute("ZREM", name, *members))

    async def zremrangebyrank(self, name: str, start: int, end: int) -> int:
        return int(await self.link.execute("ZREMRANGEBYRANK", name, start, end))

    async def zremrangebyscore(self, name: str, low: RedisArg, high: RedisArg) -> int:
        return int(await self.link.execute("ZREMRANGEBYSCORE", name, low, high))

    # -- streams -----------------------------------------------------------------------------------
    async def xadd(self, name: str, fields: Mapping[str, RedisArg], maxlen: int | None = None,
                   approximate: bool = True) -> bytes:
        trim = ("MAXLEN", "~" if approximate else "=", maxlen) if maxlen is not None else ()
        flat = [part for item in fields.items() for part in item]
        entry_id: bytes = await self.link.execute("XADD", name, *trim, "*", *flat)
        return entry_id

    async def xlen(self, name: str) -> int:
        return int(await self.link.execute("XLEN", name))

    async def xdel(self, name: str, *ids: str) -> int:
        return int(await self.link.execute("XDEL", name, *ids))

    async def xtrim(self, name: str, minid: str, approximate: bool = True) -> int:
        return int(await self.link.execute("XTRIM", name, "MINID", "~" if approximate else "=", minid))

    async def xrange(self, name: str, min: str = "-", max: str = "+", count: int | None = None
                     ) -> list[StreamEntry]:
        return _entries(await self.link.execute("XRANGE", name, min, max, *_opt("COUNT", count)))

    async def xrevrange(self, name: str, max: str = "+", min: str = "-", count: int | None = None
                        ) -> list[StreamEntry]:
        return _entries(await self.link.execute("XREVRANGE", name, max, min, *_opt("COUNT", count)))

    async def xread(self, streams: Mapping[str, str], count: int | None = None, block_ms: int | None = None
                    ) -> list[tuple[bytes, list[StreamEntry]]]:
        """Entries after each stream's id; with `block_ms`, waits that long (0: forever) for some."""
        args = ("XREAD", *_opt("COUNT", count), *_opt("BLOCK", block_ms), "STREAMS", *streams,
                *streams.values())
        return _streams(await self._maybe_blocking(block_ms, args))

    async def xgroup_create(self, name: str, group: str, id: str = "$", mkstream: bool = False) -> bool:
        create = ("XGROUP", "CREATE", name, group, id)
        reply = await self.link.execute(*create, *(("MKSTREAM",) if mkstream else ()))
        return bool(reply == b"OK")

    async def xreadgroup(self, group: str, consumer: str, streams: Mapping[str, str],
                         count: int | None = None, block_ms: int | None = None
                         ) -> list[tuple[bytes, list[StreamEntry]]]:
        args = ("XREADGROUP", "GROUP", group, consumer, *_opt("COUNT", count), *_opt("BLOCK", block_ms),
                "STREAMS", *streams, *streams.values())
        return _streams(await self._maybe_blocking(block_ms, args))

    async def xautoclaim(self, name: str, group: str, consumer: str, min_idle_ms: int, start_id: str = "0-0",
                         count: int | None = None) -> tuple[bytes, list[ClaimedEntry]]:
        """(next start id, claimed entries)."""
        reply = await self.link.execute("XAUTOCLAIM", name, group, consumer, min_idle_ms, start_id,
                                        *_opt("COUNT", count))
        claimed: list[ClaimedEntry] = [(e[0], _pairs(e[1])) if e is not None else (None, None)
                                       for e in reply[1]]
        return reply[0], claimed

    async def xack(self, name: str, group: str, *ids: RedisArg) -> int:
        return int(await self.link.execute("XACK", name, group, *ids))

    async def xinfo_groups(self, name: str) -> list[dict[str, Any]]:
        """Each group as a dict keyed by field name (`name`, `pending`, `last-delivered-id`, ...)."""
        return [{bytes(k).decode(): v for k, v in _pairs(group).items()}
                for group in await self.link.execute("XINFO", "GROUPS", name)]

    async def _maybe_blocking(self, block_ms: int | None, args: tuple[RedisArg, ...]) -> Any:
        if block_ms is None:
            return await self.link.execute(*args)
        return await self.execute_blocking(block_ms / 1000, *args)


def _block_timeout(timeout_s: float) -> str:
    """A blocking command's timeout in seconds as Redis reads it: Redis 6.2 multiplies by 1000 and
    truncates to whole milliseconds, so "0.001" came out as 0.999... → 0, "block forever" (see
    docs/architecture.md, Redis). Half a millisecond more lands every positive timeout on its
    intended whole millisecond; 0 stays "forever"."""
    if timeout_s <= 0:
        return "0"
    ms = max(1, math.ceil(timeout_s * 1000))
    return f"{(ms + 0.5) / 1000:.4f}"


def _info_value(value: str) -> Any:
    if "=" in value:
        return {k: _info_value(v) for k, _, v in (item.rpartition("=") for item in value.split(",") if item)}
    try:
        return float(value) if "." in value else int(value)
    except ValueError:
        return value


def _opt(name: str, value: RedisArg | None) -> tuple[RedisArg, ...]:
    return () if value is None else (name, value)


def _limit(start: int | None, num: int | None) -> tuple[RedisArg, ...]:
    if start is None and num is None:
        return ()
    return ("LIMIT", start or 0, -1 if num is None else num)


def _pairs(flat: Iterable[Any]) -> dict[Any, Any]:
    items = iter(flat)
    return dict(zip(items, items, strict=True))


def _scored(flat: Sequence[Any]) -> list[tuple[bytes, float]]:
    return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]


def _entries(raw: Sequence[Any] | None) -> list[StreamEntry]:
    return [(entry[0], _pairs(entry[1])) for entry in raw or ()]


def _streams(raw: Sequence[Any] | None) -> list[tuple[bytes, list[StreamEntry]]]:
    return [(name, _entries(entries)) for name, entries in raw or ()]
