"""Consumer: the worker runtime that drains sessions from the queue with a handler callback.

One Consumer per worker process runs up to `concurrency` sessions at once (asyncio tasks). For
each `ready` entry it acquires the session's lease, runs up to `jobs_per_turn` jobs of that
session in FIFO order (complete-and-take-next is one round trip), then releases so hot sessions
cannot starve others. One background task renews all held leases in one script call; a lease it
cannot renew is lost: that session's job is told (ctx.cancelled, ctx.lease_lost), its handler task
cancelled, the loss logged, and nothing more is written for it. Redis connection errors are
retried with backoff, so workers ride out a Redis restart on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.queue.context import Handler, JobContext
from common.queue.models import (
    PROBLEM_CANCELLED,
    JobCancelled,
    JobFailed,
    JobRecord,
    JobState,
    LeaseLost,
    RetryLater,
    text,
)
from common.queue.queue import Queue
from common.queue.scripts import Lease

log = logging.getLogger("atefleet.queue.consumer")

T = TypeVar("T")

#: Errors that mean "Redis is unreachable right now": retried with backoff.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)

#: Reconnect backoff bounds (seconds).
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


@dataclass
class _Turn:
    """A session held by this consumer: its lease, its task and the job running now."""

    lease: Lease
    expires_at: float
    task: asyncio.Task[Any] | None = None
    ctx: JobContext | None = None
    lost: bool = False
    #: The handler is running: the only time the turn's task may be cancelled (lease lost, hard
    #: stop), so that outcome writes are never interrupted half way.
    in_handler: bool = False
    #: A finishing call is in flight; it may release the lease, so a renewal that finds the lease
    #: gone meanwhile is not a loss (the finishing call itself reports a real one).
    finishing: bool = False


@dataclass(frozen=True)
class _Outcome:
    """How a handler ended: a terminal state with result/error, or a retry."""

    state: JobState | None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    retry: RetryLater | None = None


class Consumer:
    """Worker runtime (see module docstring). `run()` until `stop()`."""

    def __init__(
        self,
        queue: Queue,
        worker_id: str,
        handler: Handler,
        concurrency: int | None = None,
        jobs_per_turn: int | None = None,
        block_ms: int = 1000,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.handler = handler
        self.concurrency = concurrency or queue.config.workers.concurrency
        self.jobs_per_turn = jobs_per_turn or queue.config.workers.jobs_per_turn
        self.block_ms = block_ms
        self.stop_grace_s = stop_grace_s
        self.lease_ttl_s = queue.lease_ttl_ms / 1000
        self._turns: dict[str, _Turn] = {}
        self._turn_tasks: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        self._stop = asyncio.Event()
        self._done = asyncio.Event()
        self._hard_stop = False
        #: Counters for tests and metrics.
        self.stats = {"jobs": 0, "turns": 0, "leases_lost": 0, "retries": 0}

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Consume until `stop()`; then finish running jobs (grace), cancel the rest, return."""
        try:
            await self._retrying(self.queue.ensure_group, deadline=None)
        except Stopped:
            self._done.set()
            return
        reader = asyncio.create_task(self._read_loop(), name="consumer-reader")
        renewer = asyncio.create_task(self._renew_loop(), name="consumer-renewer")
        listener = asyncio.create_task(self._cancel_listener(), name="consumer-cancels")
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(reader, renewer, listener)
            self._done.set()

    async def stop(self) -> None:
        """Ask `run()` to stop and wait until it has."""
        self._stop.set()
        await self._done.wait()

    async def _shutdown(self, *background: asyncio.Task[None]) -> None:
        reader, renewer, listener = background
        # The reader goes first so no new session is taken; turns end after their current job.
        # It is let to finish its blocking read (entries it got still run) rather than cancelled:
        # an entry delivered but dropped would wait for the reconciler's XAUTOCLAIM.
        self._stop.set()
        self._slot_free.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), self.block_ms / 1000 + 1.0)
        await _cancel_and_wait(reader)
        if self._turn_tasks:
            await asyncio.wait(set(self._turn_tasks), timeout=self.stop_grace_s)
        # Past the grace period, cancel running handlers: each turn then releases its lease so
        # another worker resumes the interrupted job at once. Renewals keep flowing meanwhile.
        self._hard_stop = True
        for turn in list(self._turns.values()):
            if turn.in_handler and turn.task is not None:
                turn.task.cancel()
        if self._turn_tasks:
            await asyncio.wait(set(self._turn_tasks), timeout=self.lease_ttl_s)
        for task in list(self._turn_tasks):
            task.cancel()
        await _cancel_and_wait(renewer)
        await _cancel_and_wait(listener)

    # -- reading `ready` -------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        while not self._stop.is_set():
            free = self.concurrency - len(self._turn_tasks)
            if free <= 0:
                self._slot_free.clear()
                await self._slot_free.wait()
                continue  # (stop() also sets it, to end this loop)
            try:
                entries = await self._retrying(
                    lambda n=free: self.queue.read_ready(self.worker_id, n, self.block_ms),  # type: ignore[misc]
                    deadline=None,
                )
            except Stopped:
                return
            except Exception:  # a reader that dies silently would stop this worker for good
                log.exception("reading `ready` failed; retrying")
                await asyncio.sleep(BACKOFF_MAX_S)
                continue
            for entry_id, session in entries:
                task = asyncio.create_task(self._turn(entry_id, session))
                self._turn_tasks.add(task)
                task.add_done_callback(self._turn_finished)

    def _turn_finished(self, task: asyncio.Task[None]) -> None:
        self._turn_tasks.discard(task)
        self._slot_free.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("session turn crashed", exc_info=task.exception())

    # -- one session turn ------------------------------------------------------------------------
    async def _turn(self, entry_id: str, session: str) -> None:
        started = time.monotonic()
        try:
            acquired = await self._retrying(
                lambda: self.queue.acquire(entry_id, session, self.worker_id), started + self.lease_ttl_s
            )
        except LeaseLost:
            return  # if it did take the lease, the lease expires and repair re-notifies
        if acquired.lease is None:
            return
        turn = _Turn(acquired.lease, expires_at=started + self.lease_ttl_s, task=asyncio.current_task())
        stale = self._turns.get(session)
        if stale is not None:
            # Our own earlier turn outlived its lease (the new epoch proves it): stop it first.
            self._lose(stale, f"session re-acquired under epoch {turn.lease.epoch}")
        self._turns[session] = turn
        self.stats["turns"] += 1
        try:
            await self._drain(turn, acquired.job)
        except asyncio.CancelledError:
            if not turn.lost:
                await asyncio.shield(self._release_quietly(turn))
            raise
        finally:
            if self._turns.get(session) is turn:
                del self._turns[session]

    async def _drain(self, turn: _Turn, job: JobRecord | None) -> None:
        budget = self.jobs_per_turn
        while job is not None:
            budget -= 1
            outcome = await self._execute(turn, job)
            if turn.lost:
                return
            take_next = budget > 0 and not self._stop.is_set()
            turn.finishing = True
            job = await self._finish(turn, job, outcome, take_next)
            turn.finishing = False

    async def _execute(self, turn: _Turn, job: JobRecord) -> _Outcome:
        ctx = JobContext(self.queue, turn.lease, job)
        turn.ctx = ctx
        turn.in_handler = True
        try:
            return _Outcome(JobState.SUCCEEDED, result=await self.handler(ctx))
        except RetryLater as err:
            return _Outcome(None, retry=err)
        except JobFailed as err:
            return _Outcome(JobState.FAILED, error=err.problem)
        except JobCancelled as err:
            problem = {"type": PROBLEM_CANCELLED, "title": "Job cancelled", "status": 409,
                       "detail": err.detail}
            return _Outcome(JobState.CANCELLED, error=problem)
        except LeaseLost:
            turn.in_handler = False
            self._lose(turn, "a fenced write was refused")
            return _Outcome(None)
        except asyncio.CancelledError:
            if turn.lost and not self._hard_stop and turn.task is not None:
                turn.task.uncancel()  # we cancelled the handler because the lease was lost
                return _Outcome(None)
            raise
        except Exception as err:  # an unexpected handler error is retried, then DLQ
            log.exception("handler error on job %s of %s; retrying later", job.id, job.session)
            return _Outcome(None, retry=RetryLater(f"handler error: {type(err).__name__}: {err}"))
        finally:
            turn.in_handler = False

    async def _finish(
        self, turn: _Turn, job: JobRecord, outcome: _Outcome, take_next: bool
    ) -> JobRecord | None:
        """Record the outcome (fenced); the next job of this turn, or None when it ended."""
        try:
            retry, state = outcome.retry, outcome.state
            if retry is not None:
                self.stats["retries"] += 1
                await self._retrying(
                    lambda: self.queue.retry_later(
                        turn.lease, job.id, retry.reason, job.attempts, retry.delay_s
                    ),
                    turn.expires_at,
                )
                return None
            if state is None:
                return None
            nxt = await self._retrying(
                lambda: self.queue.complete(
                    turn.lease, job.id, state, result=outcome.result, error=outcome.error, take_next=take_next
                ),
                turn.expires_at,
            )
            self.stats["jobs"] += 1
            return nxt
        except LeaseLost as err:
            self._lose(turn, f"could not record the outcome of job {job.id}: {err}")
            return None

    async def _release_quietly(self, turn: _Turn) -> None:
        with contextlib.suppress(*TRANSIENT):
            await self.queue.release(turn.lease)

    # -- lease keeping ---------------------------------------------------------------------------
    def _lose(self, turn: _Turn, why: str) -> None:
        """The lease is gone: stop this session's work here and say so."""
        if turn.lost:
            return
        turn.lost = True
        self.stats["leases_lost"] += 1
        job_id = turn.ctx.job.id if turn.ctx else None
        log.warning("lease lost: session=%s epoch=%s job=%s worker=%s (%s)",
                    turn.lease.session, turn.lease.epoch, job_id, self.worker_id, why)
        if turn.ctx is not None:
            turn.ctx.lease_lost = True
            turn.ctx.cancelled.set()
        if turn.in_handler and turn.task is not None and turn.task is not asyncio.current_task():
            turn.task.cancel()

    async def _renew_loop(self) -> None:
        period = self.lease_ttl_s / 3
        while True:
            await asyncio.sleep(period)
            turns = [t for t in self._turns.values() if not t.lost]
            if not turns:
                continue
            started = time.monotonic()
            try:
                pairs = [(t.lease, t.ctx.job.id if t.ctx else None) for t in turns]
                answers = await self.queue.renew(pairs)
            except Exception as err:  # any failure to renew counts against the leases' expiry
                if not isinstance(err, TRANSIENT):
                    log.exception("lease renewal failed")
                self._expire_unrenewed(err)
                continue
            for turn, answer in zip(turns, answers, strict=True):
                self._apply_renewal(turn, answer, started)

    def _apply_renewal(self, turn: _Turn, answer: int, started: float) -> None:
        if self._turns.get(turn.lease.session) is not turn:
            return  # the turn ended (and released) while the renewal was in flight
        if answer == 0:
            if not turn.finishing:
                self._lose(turn, "renewal found another owner or none")
            return
        turn.expires_at = started + self.lease_ttl_s
        if answer == 2 and turn.ctx is not None:
            turn.ctx.cancelled.set()

    def _expire_unrenewed(self, err: BaseException) -> None:
        """Redis unreachable: a lease we could not renew before its expiry is lost."""
        now = time.monotonic()
        for turn in list(self._turns.values()):
            if turn.expires_at <= now:
                self._lose(turn, f"could not renew: {err}")

    async def _cancel_listener(self) -> None:
        """Cancel requests on the shared channel; renewals re-check `cx` if a message is missed."""
        backoff = BACKOFF_MIN_S
        while True:
            pubsub = self.queue.redis.pubsub()
            try:
                await pubsub.subscribe(self.queue.keys.cancel_channel)
                backoff = BACKOFF_MIN_S
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None:
                        self._cancel_requested(text(msg["data"]))
            except Exception as err:  # keep listening whatever happened; renewals cover the gap
                if not isinstance(err, TRANSIENT):
                    log.exception("cancel listener failed")
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
            finally:
                with contextlib.suppress(*TRANSIENT):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _cancel_requested(self, job_id: str) -> None:
        for turn in self._turns.values():
            if turn.ctx is not None and turn.ctx.job.id == job_id:
                turn.ctx.cancelled.set()

    # -- Redis availability ----------------------------------------------------------------------
    async def _retrying(self, call: Callable[[], Awaitable[T]], deadline: float | None) -> T:
        """Run `call`, retrying connection errors with backoff.

        With a deadline (monotonic; the lease's expiry) it raises LeaseLost once the deadline
        passes: by then another worker may own the session. Without one it retries until stop,
        then raises `Stopped`.
        """
        backoff = BACKOFF_MIN_S
        while True:
            try:
                return await call()
            except TRANSIENT as err:
                if deadline is not None and time.monotonic() + backoff > deadline:
                    raise LeaseLost(f"redis unreachable until the lease deadline: {err}") from err
                if deadline is None and self._stop.is_set():
                    raise Stopped from err
                log.info("redis unreachable (%s); retrying in %.2f s", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)


class Stopped(Exception):
    """The consumer stopped while Redis was unreachable."""


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
