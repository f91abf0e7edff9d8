"""JobWaiter: wait for jobs to reach a terminal state over one shared pub/sub subscription.

Every terminal transition publishes `<job id> <state>` on the done channel. One subscription per
process fans those out to the futures of the waiting callers (one Redis connection in total, not
one per waiting request). A notification can be missed (published before the subscription, or
while reconnecting), so the record is re-checked after subscribing and after every reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.queue.leases import listen_forever
from common.queue.models import JobRecord
from common.queue.queue import Queue

log = logging.getLogger("atefleet.queue.waiter")


class JobWaiter:
    """Shared waiter of one process; `close()` it on shutdown."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._waiting: dict[str, set[asyncio.Future[None]]] = {}
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def wait(self, job_id: str, timeout_s: float) -> JobRecord | None:
        """The job once terminal, or as it is when `timeout_s` passes; None if there is no such job."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, set()).add(fut)
        try:
            self._start()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._subscribed.wait()
                    job = await self.queue.get_job(job_id)
                    if job is None or job.terminal:
                        return job
                    await fut
            return await self.queue.get_job(job_id)
        finally:
            self._forget(job_id, fut)

    async def close(self) -> None:
        """Stop listening (awaited) and wake nobody: callers still waiting time out."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="job-waiter")

    def _forget(self, job_id: str, fut: asyncio.Future[None]) -> None:
        futs = self._waiting.get(job_id)
        if futs is not None:
            futs.discard(fut)
            if not futs:
                del self._waiting[job_id]

    def _resolve(self, job_id: str) -> None:
        for fut in self._waiting.get(job_id, ()):
            if not fut.done():
                fut.set_result(None)

    async def _listen(self) -> None:
        await listen_forever(self.queue.redis, self.queue.keys.done_channel,
                             lambda data: self._resolve(data.partition(" ")[0]), name="job waiter",
                             on_subscribed=self._on_subscribed, on_lost=self._subscribed.clear)

    async def _on_subscribed(self) -> None:
        self._subscribed.set()
        await self._recheck_all()

    async def _recheck_all(self) -> None:
        """Resolve waiters whose job finished while we were not subscribed."""
        for job_id in list(self._waiting):
            job = await self.queue.get_job(job_id)
            if job is None or job.terminal:
                self._resolve(job_id)
