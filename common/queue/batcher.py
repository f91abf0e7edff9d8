"""ScriptBatcher: script calls made in the same event-loop turn go to Redis as one pipeline.

Many sessions run concurrently in one worker process and each job is one script round trip.
Sending the calls that become ready together in one pipeline (one write, non-transactional)
saves a system call and a wakeup per call, which is most of a round trip's cost on loopback.
A call never waits for more than one loop iteration before it is sent.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

RedisArg = str | int | float | bytes

#: Calls per pipeline. Smaller batches keep several pipelines in flight, so Redis executes one
#: while this process encodes the next and decodes the previous (instead of taking turns).
MAX_BATCH = 16


class LuaScript:
    """One script: its full source and SHA."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


@dataclass
class _Call:
    script: LuaScript
    keys: Sequence[str]
    args: Sequence[RedisArg]
    future: asyncio.Future[Any]


class ScriptBatcher:
    """EVALSHA calls, pipelined per loop iteration, reloading scripts Redis has forgotten."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._pending: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[RedisArg]) -> Any:
        call = _Call(script, keys, args, asyncio.get_running_loop().create_future())
        if not self._pending or len(self._pending) >= MAX_BATCH:
            # A new batch with its own sender. The sender's first step runs after the callbacks
            # already ready in this loop turn, so it takes every call they make along.
            self._pending = []
            task = asyncio.create_task(self._send(self._pending))
            self._sending.add(task)  # the loop holds tasks weakly
            task.add_done_callback(self._sending.discard)
        self._pending.append(call)
        return await call.future

    async def _send(self, batch: list[_Call]) -> None:
        if self._pending is batch:
            self._pending = []  # closed: later calls start the next batch
        pipe = self.redis.pipeline(transaction=False)
        for c in batch:
            pipe.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args)
        try:
            results = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for c in batch:
                c.future.cancel()
            raise
        except Exception as err:  # connection errors reach every caller (they retry)
            for c in batch:
                if not c.future.done():
                    c.future.set_exception(err)
            return
        for c, result in zip(batch, results, strict=True):
            if isinstance(result, NoScriptError):
                await self._reload_and_call(c)
            elif c.future.done():
                continue  # the caller was cancelled
            elif isinstance(result, BaseException):
                c.future.set_exception(result)
            else:
                c.future.set_result(result)

    async def _reload_and_call(self, c: _Call) -> None:
        """A restarted Redis (or SCRIPT FLUSH) forgot the script: load it (idempotent), call again."""
        try:
            await self.redis.script_load(c.script.source)
            result = await self.redis.execute_command(  # type: ignore[no-untyped-call]
                "EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.args
            )
        except Exception as err:
            if not c.future.done():
                c.future.set_exception(err)
            return
        if not c.future.done():
            c.future.set_result(result)
