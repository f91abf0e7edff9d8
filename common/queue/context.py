"""JobContext: what a Consumer handler sees of its job, with fenced writes to the queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from common.queue.models import JobRecord
from common.queue.output import JobOutput
from common.queue.queue import Queue
from common.queue.scripts import Lease


class JobContext:
    """One job being executed under one lease.

    `cancelled` is set when the job gets a cancel request or the lease is lost (`lease_lost`
    tells which). Every write is fenced by the lease: after a loss it raises `LeaseLost`.
    """

    def __init__(self, queue: Queue, lease: Lease, job: JobRecord) -> None:
        self.queue = queue
        self.lease = lease
        self.job = job
        self.cancelled = asyncio.Event()
        self._lease_lost = False
        #: Held, folded or streamed, and capped (see common/queue/output.py); the Consumer hands
        #: what is still held to `complete`.
        self.output = JobOutput(queue, lease, job.id, queue.output_limits)
        #: The session hash as this job last read it (`session()`), None before: for a field the
        #: job may take as it found it rather than ask Redis again (the owner a token names).
        self.last_session: dict[str, str] | None = None
        if job.cancel_requested:
            self.cancelled.set()

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost

    @property
    def cancel_requested(self) -> bool:
        """A client asked to cancel (as opposed to the lease being lost)."""
        return self.cancelled.is_set() and not self._lease_lost

    def request_cancel(self) -> None:
        """A client asked to cancel the job (the LeaseKeeper relays it)."""
        self.cancelled.set()

    def lease_gone(self) -> None:
        """The turn lost its lease: the handler is told through `cancelled` too."""
        self._lease_lost = True
        self.cancelled.set()

    async def append_output(self, stream: str, data: str) -> None:
        """Add a chunk (`stdout`/`stderr`) to the job's output (readers see it within
        `jobs.output_hold_s`). Raises LeaseLost once the lease is gone."""
        await self.output.append(stream, data)

    async def take_secrets(self) -> dict[str, str] | None:
        """The job's per-call secrets (None when it has none, or they are gone: expired with the
        job's TTL). They stay in Redis until the job ends, so a retried start gets them again."""
        return await self.queue.take_secrets(self.lease, self.job.id)

    async def update_session(self, **fields: str | int | float) -> None:
        """Fenced HSET of worker-maintained session fields (state, actor, last_activity, ...)."""
        await self.queue.update_session(self.lease, {k: str(v) for k, v in fields.items()})

    async def session(self) -> dict[str, str]:
        """The session hash as it is now."""
        env, sid = self.job.environment, self.job.session_id
        self.last_session = await self.queue.get_session(env, sid) or {}
        return self.last_session

    async def peek_next_job(self) -> JobRecord | None:
        """The next queued job of this session (e.g. to coalesce an auto-resume)."""
        return await self.queue.peek_next_job(self.lease.session)


#: A handler runs one job; its return value is the job's result (state succeeded).
Handler = Callable[[JobContext], Coroutine[Any, Any, dict[str, Any]]]
