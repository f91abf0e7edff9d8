"""A job's output and result on their way to Redis: held, folded or streamed, and capped.

Most calls print a line and end within milliseconds; a stream per call (a Redis key, its radix
tree and a listpack node: ~4.7 KB for one line) outlived the call by far. So output is held in
the worker at first: a job that ends within `jobs.output_hold_s` with at most
`jobs.output_fold_max_bytes` of output hands it to `complete`, which folds it into the job's
record (`o`); anything longer or bigger is streamed to `out:{jid}` as it comes, and its tail goes
with `complete`. Readers see the same entries either way (`Queue.read_output`).

Output stored per job is capped at `jobs.output_max_bytes`, a result at `jobs.result_max_bytes`:
past them the rest is cut with a marker, the job still succeeds, and its record says
`truncated`. While Redis refuses writes (full) or is unreachable, held output stays here (within
its cap) and is retried; what is still held when the job ends goes with `complete`, which Redis
lets finish (its first write frees memory).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.config import JobsConfig
from common.queue.compact import compact_json
from common.queue.models import TRANSIENT, LeaseLost
from common.queue.scripts import Lease

if TYPE_CHECKING:
    from common.queue.queue import Queue

#: What marks cut output and results.
OUTPUT_MARKER = "\n[output truncated: more than {limit} bytes]\n"
RESULT_MARKER = "\n[truncated: the result was more than {limit} bytes]"
#: Seconds before held output is offered again to a Redis that refused it or was away.
RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class OutputLimits:
    hold_s: float
    fold_max_bytes: int
    max_bytes: int

    @classmethod
    def of(cls, jobs: JobsConfig) -> OutputLimits:
        return cls(jobs.output_hold_s, jobs.output_fold_max_bytes, jobs.output_max_bytes)


class JobOutput:
    """One job's output (see module docstring). `append` as chunks come, `close` at the end."""

    def __init__(self, queue: Queue, lease: Lease, job_id: str, limits: OutputLimits) -> None:
        self._queue = queue
        self._lease = lease
        self._job_id = job_id
        self._limits = limits
        self._held: list[tuple[str, str]] = []
        self._held_bytes = 0
        self._stored_bytes = 0  # accepted so far, against the cap
        self._streaming = False
        self.truncated = False
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def append(self, stream: str, data: str) -> None:
        """Hold a chunk (`stdout`/`stderr`); stream what is held once the job is past holding.
        Raises LeaseLost when the lease is gone; keeps the chunk on Redis trouble."""
        data = self._within_cap(data)
        if not data:
            return
        self._held.append((stream, data))
        self._held_bytes += len(data)
        if self._streaming or self._held_bytes > self._limits.fold_max_bytes:
            try:
                await self._flush()
            except TRANSIENT:
                self._retry_later()
        elif self._timer is None and self._flusher is None:
            self._timer = asyncio.get_running_loop().call_later(self._limits.hold_s, self._flush_soon)

    async def close(self) -> str:
        """Stop streaming; what is still held, as `complete` takes it ('' for nothing)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        async with self._lock:
            held, self._held, self._held_bytes = self._held, [], 0
        return compact_json([x for chunk in held for x in chunk]) if held else ""

    def _within_cap(self, data: str) -> str:
        if self.truncated:
            return ""
        size = len(data.encode())
        room = self._limits.max_bytes - self._stored_bytes
        if size <= room:
            self._stored_bytes += size
            return data
        self.truncated = True
        self._stored_bytes = self._limits.max_bytes
        kept = data.encode()[:room].decode(errors="ignore")
        return kept + OUTPUT_MARKER.format(limit=self._limits.max_bytes)

    async def _flush(self) -> None:
        """Write what is held to the stream, in order; a chunk leaves `_held` once written."""
        async with self._lock:
            while self._held:
                stream, data = self._held[0]
                await self._queue.append_output(self._lease, self._job_id, stream, data)
                self._streaming = True
                del self._held[0]
                self._held_bytes -= len(data)

    def _flush_soon(self) -> None:
        self._timer = None
        self._flusher = asyncio.create_task(self._flush_quietly())

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except TRANSIENT:
            self._retry_later()
        except LeaseLost:
            pass  # the turn learns it from its next fenced write or renewal
        finally:
            self._flusher = None

    def _retry_later(self) -> None:
        """Redis refused or is away: keep what is held and try again later (or at `close`)."""
        self._streaming = True  # past holding: later chunks go straight on (after those held)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(RETRY_S, self._flush_soon)


def fit_result(value: dict[str, Any], encoded: str, limit: int) -> tuple[str, bool]:
    """`encoded` (the compact JSON of `value`), or past `limit` bytes the value with its longest
    text cut to fit and marked; (JSON, whether it was cut). A result with no text long enough to
    cut is replaced by a note saying so."""
    if len(encoded) <= limit:  # compact_json escapes non-ASCII: characters are bytes
        return encoded, False
    fitted = dict(value)
    marker = RESULT_MARKER.format(limit=limit)
    texts = sorted((k for k, v in fitted.items() if isinstance(v, str)), key=lambda k: -len(fitted[k]))
    for key in texts:
        # Each pass cuts at least the excess (escapes make the JSON longer than the text).
        while (excess := len(compact_json(fitted)) - limit) > 0:
            raw = fitted[key].removesuffix(marker).encode()
            if not raw:
                break
            keep = max(0, len(raw) - excess - len(marker))
            fitted[key] = raw[:keep].decode(errors="ignore") + marker
    out = compact_json(fitted)
    if len(out) > limit:
        out = compact_json({"truncated": marker.strip()})
    return out, True
