"""Per-principal quotas (`quotas` in the config): what one caller may hold at once.

Sessions owned, jobs queued (per session and in total) and output bytes stored are counted in
Redis and checked by the enqueue script (no extra round trip); open SSE streams and long-polls
are counted here, per API process (`StreamSlots`). Each refusal is a `QuotaExceeded` problem
(429 with Retry-After when waiting frees the quota, 403 when only the caller's own action does)
and is audited.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from api.auth import Principal
from api.problems import QuotaExceeded
from common.queue.models import QuotaRefused

if TYPE_CHECKING:
    from api.fleet import Fleet

#: What the caller can do about each quota the enqueue script checks.
_ADVICE = {
    "sessions_owned": "destroy sessions it no longer needs (destroyed ones are forgotten by GC)",
    "jobs_queued_per_session": "wait for the session's queued jobs to run",
    "jobs_queued": "wait for its queued jobs to run",
    "output_bytes": "wait for older output to expire",
}

#: Retry-After of a refused stream or long-poll (seconds): another of the caller's ends by then.
STREAM_RETRY_AFTER_S = 1.0


async def refused_enqueue(fleet: Fleet, principal_id: str, err: QuotaRefused, op: str,
                          batch: bool = False) -> QuotaExceeded:
    """The problem answering an enqueue over quota (naming the call's `index` in a batch), audited."""
    limit = getattr(fleet.config.quotas.of(principal_id), err.quota)
    await fleet.audit.record("quota_refused", principal_id, op=op, why=err.quota)
    problem = QuotaExceeded(err.quota, limit, f"quota {err.quota} ({limit}) is used up: "
                            f"{_ADVICE.get(err.quota, 'wait')}", retry_after_s=err.retry_after_s)
    if batch:
        problem.extensions["index"] = err.index
    return problem


class StreamSlots:
    """Open SSE streams and long-polls per principal, in this API process."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def count(self, principal_id: str) -> int:
        return self._open.get(principal_id, 0)

    async def check(self, fleet: Fleet, principal: Principal, op: str) -> None:
        """Raise QuotaExceeded (429, audited) when the principal holds all its slots; the stream
        or long-poll then runs inside `held`."""
        limit = fleet.config.quotas.of(principal.id).streams_open
        if limit and self.count(principal.id) >= limit:
            await fleet.audit.record("quota_refused", principal.id, op=op, why="streams_open")
            raise QuotaExceeded("streams_open", limit, f"quota streams_open ({limit}) is used up: "
                                "close a stream or long-poll first", retry_after_s=STREAM_RETRY_AFTER_S)

    @contextmanager
    def held(self, principal_id: str) -> Iterator[None]:
        """One of the principal's slots, for as long as the block runs. Taken here rather than
        at `check`: an SSE body that never starts (the client left first) then holds none."""
        self._open[principal_id] = self.count(principal_id) + 1
        try:
            yield
        finally:
            left = self.count(principal_id) - 1
            if left > 0:
                self._open[principal_id] = left
            else:
                self._open.pop(principal_id, None)
