"""The dead-letter queue: jobs that exhausted their attempts (`retry.lua` adds them), read, replayed
or discarded by an operator.

Entries are ids of the `dlq` stream (`<ms>-<seq>`), newest first when listed. A replay puts the same
job back at the tail of its session's FIFO (`replay_dlq.lua`); a discard only drops the entry (the
failed job record stays until its TTL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.queue.keys import split_session
from common.queue.models import text
from common.queue.queue import Queue, now_ms


class ReplayRefused(Exception):
    """The entry cannot be replayed: `reason` is 'missing', 'expired' or 'not_failed'."""

    def __init__(self, reason: str, job_id: str | None, state: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.job_id = job_id
        self.state = state


@dataclass(frozen=True)
class DeadLetter:
    """One DLQ entry: which job, of which session, why and when it was given up on."""

    id: str
    job_id: str
    environment: str
    session_id: str
    reason: str
    attempts: int
    at_ms: int

    @classmethod
    def from_entry(cls, entry_id: Any, raw: dict[Any, Any]) -> DeadLetter:
        f = {text(k): text(v) for k, v in raw.items()}
        env, sid = split_session(f.get("session", ""))
        return cls(id=text(entry_id), job_id=f.get("job", ""), environment=env, session_id=sid,
                   reason=f.get("reason", ""), attempts=int(f.get("attempts") or 0),
                   at_ms=int(f.get("ts_ms") or 0))


def is_entry_id(value: str) -> bool:
    """Whether `value` is a stream entry id (`<ms>-<seq>`), the only thing these calls accept."""
    ms, sep, seq = value.partition("-")
    return ms.isdigit() and bool(sep) and seq.isdigit() and len(value) <= 41


class DeadLetters:
    """Reads and acts on the `dlq` stream of one queue."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.key = queue.keys.dlq

    async def size(self) -> int:
        return int(await self.queue.redis.xlen(self.key))

    async def page(self, before: str | None, limit: int) -> tuple[list[DeadLetter], str | None]:
        """Entries newest first, strictly older than `before` (an entry id); (page, next cursor)."""
        high = f"({before}" if before else "+"
        raw = await self.queue.redis.xrevrange(self.key, max=high, min="-", count=limit)
        page = [DeadLetter.from_entry(i, f) for i, f in raw]
        return page, (page[-1].id if len(page) == limit else None)

    async def get(self, entry_id: str) -> DeadLetter | None:
        raw = await self.queue.redis.xrange(self.key, min=entry_id, max=entry_id)
        return DeadLetter.from_entry(*raw[0]) if raw else None

    async def replay(self, entry_id: str) -> str:
        """Re-enqueue the entry's job at its session's tail; its job id. Raises ReplayRefused."""
        outcome, job_id, state = await self.queue.scripts.replay_dlq(entry_id, now_ms())
        if outcome != "queued" or job_id is None:
            raise ReplayRefused(outcome, job_id, state)
        return job_id

    async def discard(self, entry_id: str) -> bool:
        """Drop the entry; False when there was none."""
        return int(await self.queue.redis.xdel(self.key, entry_id)) == 1
