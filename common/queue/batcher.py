"""ScriptBatcher: the queue's script calls (EVALSHA), batched per event-loop iteration.

Many sessions run concurrently in one worker process and each job is a script round trip or
two. The calls go over one `RedisLink`, which writes every command issued in the same loop
iteration in one go (one system call and one Redis wakeup for the lot) and matches replies in
order; no call waits more than one loop iteration to be sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from common.queue.models import OOM_REPLY, RedisFull
from common.redis.link import RedisArg, RedisLink

__all__ = ["LuaScript", "RedisArg", "ScriptBatcher"]


class LuaScript:
    """One script: its full source and SHA."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class ScriptBatcher:
    """EVALSHA calls over one pipelined link, reloading scripts Redis has forgotten."""

    def __init__(self, redis: Redis) -> None:
        self._link = RedisLink(redis)

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[RedisArg]) -> Any:
        """The script's reply. Raises RedisFull when Redis, at maxmemory, refused the script's
        first write (a script that wrote once is let finish, so nothing is half-written)."""
        try:
            try:
                return await self._link.execute("EVALSHA", script.sha, len(keys), *keys, *args)
            except NoScriptError:
                # A restarted Redis (or SCRIPT FLUSH) forgot it: load it (idempotent), call again.
                await self._link.execute("SCRIPT", "LOAD", script.source)
                return await self._link.execute("EVALSHA", script.sha, len(keys), *keys, *args)
        except ResponseError as err:
            if OOM_REPLY in str(err):
                raise RedisFull(str(err)) from err
            raise

    async def aclose(self) -> None:
        await self._link.aclose()
