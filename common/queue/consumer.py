"""Consumer: the worker runtime that drains sessions from the queue with a handler callback.

One Consumer per worker process runs up to `concurrency` sessions at once (asyncio tasks). Its
reader takes sessions waiting in `ready` and announces the slots it has left; while it has slots
announced, sessions that become ready are handed to it directly, lease and head job included, so
a job reaches a waiting worker in one step (no read-then-acquire round trip). Each session turn
runs up to `jobs_per_turn` jobs of that session in FIFO order (complete-and-take-next is one round
trip), then releases so hot sessions cannot starve others. A turn is a state machine
(common/queue/turn.py): the Consumer reports what its task does, `LeaseKeeper` renews all held
leases in one script call and reports what it learns of them (leases.py); a lost lease stops that
session's work here and nothing more is written for it. Redis connection errors are retried with
backoff, so workers ride out a Redis restart on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from common.metrics import JOB_RETRIES, JOBS_FINISHED, Children
from common.queue.context import Handler, JobContext
from common.queue.leases import BACKOFF_MAX_S, BACKOFF_MIN_S, LeaseKeeper
from common.queue.models import (
    PROBLEM_CANCELLED,
    PROBLEM_INVALID_RESULT,
    TRANSIENT,
    JobCancelled,
    JobFailed,
    JobRecord,
    JobState,
    LeaseLost,
    RetryLater,
)
from common.queue.queue import Queue
from common.queue.scripts import Handoff
from common.queue.turn import Turn, TurnEvent, TurnState

log = logging.getLogger("atefleet.queue.consumer")

T = TypeVar("T")

#: An announcement of free slots outlives this many missed renewals.
ANNOUNCE_RENEWALS = 3

@dataclass(slots=True)
class _Outcome:
    """A handler's terminal outcome: the state with its result or error."""

    state: JobState
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


#: How a handler ended: terminal, to be retried, or refused a fenced write (the lease is gone).
_Ended = _Outcome | RetryLater | LeaseLost


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
        self._turn_tasks: set[asyncio.Task[None]] = set()
        #: Turns waiting outside the queue's work (see `set_waiting`): not counted as busy.
        self._waiting = 0
        self._slot_free = asyncio.Event()
        self._stop = asyncio.Event()
        self._done = asyncio.Event()
        self._running = False
        self._counts = {"jobs": 0, "turns": 0, "retries": 0}
        self._leases = LeaseKeeper(queue, worker_id)
        #: How long an announcement of free slots lasts unrenewed (the reader renews it every
        #: block_ms). Past it the worker is taken for dead: nothing more is handed to it, and the
        #: reconciler hands on what its inbox holds. A crashed worker attracts sessions this long.
        self.announce_s = ANNOUNCE_RENEWALS * block_ms / 1000
        self._finished = Children(JOBS_FINISHED)

    @property
    def stats(self) -> dict[str, int]:
        """Counters for tests and metrics: jobs, turns, retries, leases_lost."""
        return {**self._counts, "leases_lost": self._leases.losses}

    # -- lifecycle -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Consume until `stop()`; then finish running jobs (grace), cancel the rest, return."""
        self._running = True
        try:
            await self._retrying(self.queue.load_scripts, deadline=None)
            # A previous process under this id may have left sessions in the inbox: hand them on.
            await self._retrying(lambda: self.queue.retire(self.worker_id, wake=False), deadline=None)
        except Stopped:
            self._done.set()
            return
        reader = asyncio.create_task(self._read_loop(), name="consumer-reader")
        renewer = asyncio.create_task(self._leases.renew_loop(), name="consumer-renewer")
        listener = asyncio.create_task(self._leases.cancel_listener(), name="consumer-cancels")
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(reader, renewer, listener)
            self._done.set()

    async def stop(self) -> None:
        """Ask `run()` to stop and wait until it has (at once if it never ran)."""
        self._stop.set()
        if self._running:
            await self._done.wait()

    async def _shutdown(self, *background: asyncio.Task[None]) -> None:
        reader, renewer, listener = background
        # The reader goes first so no new session is taken; turns end after their current job.
        # Retiring withdraws the announcement, hands on what the inbox holds and wakes the
        # reader's blocking read. The reader is let to finish that read (a session it got still
        # runs) rather than cancelled: a handoff popped but dropped would wait for its lease to
        # expire. A second retire catches a renewal the reader sent while the first ran.
        self._stop.set()
        self._slot_free.set()
        await self._retire(wake=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), self.block_ms / 1000 + 1.0)
        await _cancel_and_wait(reader)
        await self._retire(wake=False)
        if self._turn_tasks:
            await asyncio.wait(set(self._turn_tasks), timeout=self.stop_grace_s)
        # Past the grace period, running handlers are cancelled and no job begins: each turn then
        # releases its lease so another worker resumes the interrupted job at once. Renewals keep
        # flowing meanwhile. Outcome writes in flight finish (or end with the lease's expiry).
        for turn in self._leases.held():
            turn.on(TurnEvent.DEADLINE)
        if self._turn_tasks:
            await asyncio.wait(set(self._turn_tasks), timeout=self.lease_ttl_s)
        for task in list(self._turn_tasks):
            task.cancel()
        await _cancel_and_wait(renewer)
        await _cancel_and_wait(listener)

    def set_waiting(self, turns: int) -> None:
        """`turns` of this worker's turns wait for something only other sessions' jobs can free
        (a resume waiting for a Substrate worker that a park job frees): they do not count
        against `concurrency`, so the worker keeps taking sessions, those park jobs among them."""
        self._waiting = turns
        self._slot_free.set()

    # -- taking sessions -------------------------------------------------------------------------
    async def _read_loop(self) -> None:
        announced = 0  # slots announced and not handed yet, as far as this worker knows
        renew_at = 0.0  # monotonic time to renew the announcement by
        while not self._stop.is_set():
            free = self.concurrency + self._waiting - len(self._turn_tasks)
            now = time.monotonic()
            # Freed slots are announced once half the free ones are unannounced, not one by one:
            # while some are announced, sessions are handed here or to other workers anyway
            # (`ready` fills only when no worker has a slot announced), and a top-up is a round
            # trip. Without this, every handoff was followed by one.
            if (free > 0 and 2 * announced <= free) or (announced > 0 and now >= renew_at):
                unannounced = max(free - announced, 0)  # past concurrency after a lapse: none
                try:
                    taken = await self._retrying(
                        lambda n=unannounced, f=free: self.queue.take_work(  # type: ignore[misc]
                            self.worker_id, n, announce_s=self.announce_s, free=f
                        ),
                        deadline=None,
                    )
                except Stopped:
                    return
                except Exception:  # a reader that dies silently would stop this worker for good
                    log.exception("taking work failed; retrying")
                    await asyncio.sleep(BACKOFF_MAX_S)
                    continue
                announced = free - len(taken)  # every free slot not filled is announced now
                renew_at = now + self.block_ms / 1000
                self._start(taken)
            elif announced <= 0:  # every slot busy: nothing announced, nothing to wait for in Redis
                self._slot_free.clear()
                await self._slot_free.wait()  # (stop() also sets it, to end this loop)
            else:
                try:
                    # The wait is what is left until the renewal at each try: a retry after a
                    # backoff must not block past it (the announcement would lapse meanwhile).
                    handed = await self._retrying(
                        lambda until=renew_at: self.queue.wait_handoffs(  # type: ignore[misc]
                            self.worker_id, until - time.monotonic()
                        ),
                        deadline=None,
                    )
                except Stopped:
                    return
                except Exception:
                    log.exception("reading the inbox failed; retrying")
                    await asyncio.sleep(BACKOFF_MAX_S)
                    continue
                announced -= len(handed)
                self._start(handed)

    def _start(self, handoffs: list[Handoff]) -> None:
        for handoff in handoffs:
            task = asyncio.create_task(self._turn(handoff))
            self._turn_tasks.add(task)
            task.add_done_callback(self._turn_finished)

    async def _retire(self, wake: bool) -> None:
        with contextlib.suppress(*TRANSIENT):  # unreachable: its handed sessions' leases expire
            await self.queue.retire(self.worker_id, wake=wake)

    def _turn_finished(self, task: asyncio.Task[None]) -> None:
        self._turn_tasks.discard(task)
        self._slot_free.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("session turn crashed", exc_info=task.exception())

    # -- one session turn ------------------------------------------------------------------------
    async def _turn(self, handoff: Handoff) -> None:
        # The lease was taken when the session was handed over, a moment ago at most.
        task = cast("asyncio.Task[None]", asyncio.current_task())
        turn = Turn(handoff.lease, task, expires_at=time.monotonic() + self.lease_ttl_s)
        self._leases.hold(turn)
        self._counts["turns"] += 1
        try:
            await self._drain(turn, handoff.job)
        except asyncio.CancelledError:
            turn.on(TurnEvent.CANCELLED)
            raise
        finally:
            if turn.state is TurnState.STOPPING:
                await asyncio.shield(self._release_quietly(turn))
            self._leases.drop(turn)

    async def _drain(self, turn: Turn, job: JobRecord | None) -> None:
        budget = self.jobs_per_turn
        while job is not None:
            ctx = JobContext(self.queue, turn.lease, job)
            if not turn.begin(ctx):
                return  # stopping, or lost while the last outcome was written
            ended = await self._execute(ctx)
            if not turn.on(TurnEvent.HANDLED):
                return  # lost (or stopping) while the handler ran: its outcome is not recorded
            budget -= 1
            job = await self._finish(turn, ctx, ended, take_next=budget > 0 and not self._stop.is_set())

    async def _execute(self, ctx: JobContext) -> _Ended:
        # A cancellation (the turn's lease lost, or the stop's deadline) is not caught here: it
        # ends the turn, which does what its state says (turn.py).
        try:
            return _Outcome(JobState.SUCCEEDED, result=await self.handler(ctx))
        except (RetryLater, LeaseLost) as err:
            return err
        except JobFailed as err:
            return _Outcome(JobState.FAILED, error=err.problem)
        except JobCancelled as err:
            problem = {"type": PROBLEM_CANCELLED, "title": "Job cancelled", "status": 409,
                       "detail": err.detail}
            return _Outcome(JobState.CANCELLED, error=problem)
        except Exception as err:  # an unexpected handler error is retried, then DLQ
            job = ctx.job
            log.exception("handler error on job %s of %s; retrying later", job.id, job.session)
            return RetryLater(f"handler error: {type(err).__name__}: {err}")

    async def _finish(
        self, turn: Turn, ctx: JobContext, ended: _Ended, take_next: bool
    ) -> JobRecord | None:
        """Record how the job ended (fenced); the next job of this turn, or None when it ended."""
        job = ctx.job
        if isinstance(ended, LeaseLost):
            self._leases.lose(turn, f"a fenced write of job {job.id} was refused: {ended}")
            return None
        # Output still held goes with the terminal transition; a retried job drops it (the next
        # run's output replaces it).
        output = await ctx.output.close()
        try:
            if isinstance(ended, RetryLater):
                await self._retry(turn, job, ended)
                nxt = None
            else:
                nxt = await self._complete(turn, job, ended, take_next, output, ctx.output.truncated)
        except LeaseLost as err:
            self._leases.lose(turn, f"could not record the outcome of job {job.id}: {err}")
            return None
        if nxt is None:
            turn.on(TurnEvent.RELEASED)
        return nxt

    async def _retry(self, turn: Turn, job: JobRecord, retry: RetryLater) -> None:
        self._counts["retries"] += 1
        JOB_RETRIES.labels(reason=retry.reason.split(":", 1)[0][:40]).inc()
        await self._retrying(
            lambda: self.queue.retry_later(turn.lease, job.id, retry.reason, job.attempts, retry.delay_s),
            turn.expires_at,
        )

    async def _complete(
        self, turn: Turn, job: JobRecord, outcome: _Outcome, take_next: bool, output: str,
        output_cut: bool,
    ) -> JobRecord | None:
        state = outcome.state
        try:
            nxt = await self._retrying(
                lambda: self.queue.complete(
                    turn.lease, job.id, state, result=outcome.result, error=outcome.error,
                    take_next=take_next, output=output, output_truncated=output_cut,
                ),
                turn.expires_at,
            )
        except (TypeError, ValueError) as err:  # not JSON: fail the job rather than loop on it
            log.error("job %s of %s: outcome is not JSON (%s)", job.id, job.session, err)
            problem = {"type": PROBLEM_INVALID_RESULT, "title": "Invalid job result", "status": 500,
                       "detail": f"the handler's outcome could not be stored: {err}"}
            state = JobState.FAILED
            nxt = await self._retrying(
                lambda: self.queue.complete(
                    turn.lease, job.id, state, error=problem, take_next=take_next
                ),
                turn.expires_at,
            )
        self._counts["jobs"] += 1
        self._finished(job.kind, state).inc()
        return nxt

    async def _release_quietly(self, turn: Turn) -> None:
        with contextlib.suppress(*TRANSIENT):
            await self.queue.release(turn.lease)

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
                    raise LeaseLost(f"redis unreachable or full until the lease deadline: {err}") from err
                if deadline is None and self._stop.is_set():
                    raise Stopped from err
                log.info("redis unreachable or full (%s); retrying in %.2f s", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)


class Stopped(Exception):
    """The consumer stopped while Redis was unreachable."""


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
