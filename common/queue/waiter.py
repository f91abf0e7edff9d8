"""JobWaiter: wait for jobs to reach a terminal state over one shared pub/sub subscription.

Every terminal transition publishes `<job id> <state>` on the done channel, followed by
` res <json>` or ` err <json>` when that answer is small (see `finish` in lua/_lib.lua). One
subscription per process fans those out to the futures of the waiting callers (one Redis
connection in total, not one per waiting request).

A notification can be missed: published before the caller registered, or while the subscription
was down. Two ways to wait cover that:

- `watch(job_id)` before the job is enqueued (the sync tool-call path): while the subscription
  holds, the job cannot end unnoticed, so the caller needs no read of the record at all — the
  answer comes inline in the notification. Only after a resubscription, or when the watch was
  taken before the first subscription, is the record read.
- `follow(job_id)` for a job that may already have ended (an idempotent replay), and `wait(job_id)`
  (long-poll) on top of it: the record is read once subscribed, and `wait` reads it again at the end.
  `wait_any(job_ids)` follows many jobs at once (POST /v1/jobs:wait) and answers those ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.queue.compact import decode_result
from common.queue.leases import listen_forever
from common.queue.models import JobRecord, JobState
from common.queue.queue import Queue

log = logging.getLogger("atefleet.queue.waiter")


@dataclass(frozen=True)
class Outcome:
    """How a job ended: its terminal state and its answer (result or problem), as the sync route
    needs them."""

    state: JobState
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @classmethod
    def of(cls, job: JobRecord) -> Outcome:
        return cls(job.state, job.result, job.error)


#: What a waiting future resolves to: the outcome read off the notification, or None when the
#: notification did not carry it (too large, or a re-check) and the record must be read.
_Note = Outcome | None


def _terminal(jobs: Sequence[JobRecord | None]) -> list[JobRecord]:
    return [job for job in jobs if job is not None and job.terminal]


def parse_note(message: str) -> tuple[str, _Note]:
    """`<jid> <state>[ res|err <json>]` → (job id, inline outcome or None)."""
    job_id, _, rest = message.partition(" ")
    state, _, inline = rest.partition(" ")
    field, _, value = inline.partition(" ")
    if field == "res":
        return job_id, Outcome(JobState(state), result=decode_result(value))
    if field == "err":
        return job_id, Outcome(JobState(state), error=json.loads(value))
    if state == JobState.CANCELLED:
        return job_id, Outcome(JobState.CANCELLED)
    return job_id, None


class Watch:
    """Interest in one job, registered with the waiter; `close()` it when done (or use `with`)."""

    def __init__(self, waiter: JobWaiter, job_id: str, generation: int | None) -> None:
        self.job_id = job_id
        self._waiter = waiter
        self._generation = generation
        self._future: asyncio.Future[_Note]
        self._register()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def outcome(self, timeout_s: float) -> Outcome | None:
        """The job's outcome once terminal; None when it is not within `timeout_s` (or is gone)."""
        waiter = self._waiter
        # Not covered by the subscription since before the job could end: read it first.
        read = self._generation is None or self._generation != waiter._generation
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while True:
                    if read:
                        await waiter._subscribed.wait()
                        job = await waiter.queue.get_job(self.job_id)
                        if job is None:
                            return None
                        if job.terminal:
                            return Outcome.of(job)
                    note = await self._future
                    if note is not None:
                        return note
                    # A re-check (a (re)subscription found the job ended, or not yet enqueued:
                    # a watch is taken before its job exists). Armed again before the read, so
                    # an end after it is noticed; one before it, the read sees.
                    self.close()
                    self._register()
                    read = True
        return None

    def _register(self) -> None:
        self._future = asyncio.get_running_loop().create_future()
        self._waiter._waiting.setdefault(self.job_id, set()).add(self._future)

    def close(self) -> None:
        futures = self._waiter._waiting.get(self.job_id)
        if futures is not None:
            futures.discard(self._future)
            if not futures:
                del self._waiter._waiting[self.job_id]


class JobWaiter:
    """Shared waiter of one process; `start()` it early and `close()` it on shutdown."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._waiting: dict[str, set[asyncio.Future[_Note]]] = {}
        self._subscribed = asyncio.Event()
        #: Bumped on every (re)subscription: a watch taken under an older one may have missed its job.
        self._generation = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Subscribe in the background (idempotent); watches taken before it is up read the record."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="job-waiter")

    def watch(self, job_id: str) -> Watch:
        """Register for `job_id` before enqueueing it (see the module docstring)."""
        self.start()
        return Watch(self, job_id, self._generation if self._subscribed.is_set() else None)

    def follow(self, job_id: str) -> Watch:
        """Register for a job that exists already (it may have ended: its record is read)."""
        self.start()
        return Watch(self, job_id, None)

    async def wait(self, job_id: str, timeout_s: float) -> JobRecord | None:
        """The job once terminal, or as it is when `timeout_s` passes; None if there is no such job."""
        with self.follow(job_id) as watch:
            await watch.outcome(timeout_s)
        return await self.queue.get_job(job_id)

    async def wait_any(self, job_ids: Sequence[str], timeout_s: float,
                       admit: Callable[[list[JobRecord | None]], Awaitable[None]]) -> list[JobRecord]:
        """The listed jobs terminal once at least one is, or [] when none ends within `timeout_s`.

        Every id is watched before the records are read (once subscribed), so a job that ended
        before the call counts; `admit` sees that one read first (the caller's checks, which may
        raise). After the first note, only the jobs noted are read again."""
        watches = [self.follow(job_id) for job_id in job_ids]
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._subscribed.wait()
                    jobs = await self._read(job_ids)
                    await admit(jobs)
                    if ended := _terminal(jobs):
                        return ended
                    await asyncio.wait([w._future for w in watches], return_when=asyncio.FIRST_COMPLETED)
                    return _terminal(await self._read([w.job_id for w in watches if w._future.done()]))
            return []
        finally:
            for watch in watches:
                watch.close()

    async def _read(self, job_ids: Sequence[str]) -> list[JobRecord | None]:
        return await asyncio.gather(*(self.queue.get_job(job_id) for job_id in job_ids))

    async def close(self) -> None:
        """Stop listening (awaited) and wake nobody: callers still waiting time out."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _resolve(self, job_id: str, note: _Note) -> None:
        for future in self._waiting.get(job_id, ()):
            if not future.done():
                future.set_result(note)

    def _on_message(self, message: str) -> None:
        job_id = message.partition(" ")[0]
        if job_id in self._waiting:  # most notifications are for other processes' callers
            self._resolve(*parse_note(message))

    async def _listen(self) -> None:
        await listen_forever(self.queue.redis, self.queue.keys.done_channel, self._on_message,
                             name="job waiter", on_subscribed=self._on_subscribed,
                             on_lost=self._subscribed.clear)

    async def _on_subscribed(self) -> None:
        self._generation += 1
        self._subscribed.set()
        await self._recheck_all()

    async def _recheck_all(self) -> None:
        """Resolve waiters whose job ended while we were not subscribed (they read the record)."""
        for job_id in list(self._waiting):
            job = await self.queue.get_job(job_id)
            if job is None or job.terminal:
                self._resolve(job_id, None)
