"""Turn: one session held by a worker, from the handoff to the end, as a state machine.

A turn begins when a session is handed to the worker (its lease and head job) and runs up to
`jobs_per_turn` of the session's jobs. Its state is written only here, by `Turn.on`, which looks
the (state, event) pair up in `TRANSITIONS` (the same table is in docs/architecture.md, "The
worker's turn"). The Consumer reports what the turn's task does (a job begins, its handler
ended, the outcome write released the session, the task was cancelled) and the end of its stop's
grace period; the LeaseKeeper reports what Redis says of the lease.

The one effect a transition has on the turn's task is cancelling it, and only out of HANDLING:
the handler is the only code ever interrupted (an outcome write is never cut half way), and the
cancelled task ends (releasing the lease when it still holds it); it is never un-cancelled.
Every event a row does not name is ignored: a loss reported twice, a renewal answer for a turn
that already ended, a stop for a turn that already lost its lease.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

from common.queue.context import JobContext
from common.queue.scripts import Lease


class TurnState(StrEnum):
    #: The lease is held; no job has begun yet.
    HELD = "held"
    #: A job's handler runs: the only state in which the turn's task may be cancelled.
    HANDLING = "handling"
    #: The outcome write is in flight (complete, retry); it may release the lease itself.
    FINISHING = "finishing"
    #: The worker stops: no job begins; the turn releases the session on its way out, unless a
    #: write in flight ends the turn first. The interrupted job resumes at the head elsewhere.
    STOPPING = "stopping"
    #: The lease is gone: nothing more is written for this session here.
    LOST = "lost"
    #: The outcome write released the session (or retried its job, which releases it).
    ENDED = "ended"


class TurnEvent(StrEnum):
    BEGIN = "begin"  # a job of the session starts (the handoff's, or the one complete took)
    HANDLED = "handled"  # the handler returned or raised
    RELEASED = "released"  # the outcome write ended the turn and released the lease
    REFUSED = "refused"  # a renewal found another owner or none
    LOST = "lost"  # a fenced write was refused, or no renewal before expiry, or re-acquired
    DEADLINE = "deadline"  # the stop's grace period is over
    CANCELLED = "cancelled"  # the turn's task was cancelled


#: (state, event) -> (next state, whether the turn's task is cancelled). Pairs not here: ignored.
TRANSITIONS: dict[tuple[TurnState, TurnEvent], tuple[TurnState, bool]] = {
    (TurnState.HELD, TurnEvent.BEGIN): (TurnState.HANDLING, False),
    (TurnState.FINISHING, TurnEvent.BEGIN): (TurnState.HANDLING, False),
    (TurnState.HANDLING, TurnEvent.HANDLED): (TurnState.FINISHING, False),
    (TurnState.FINISHING, TurnEvent.RELEASED): (TurnState.ENDED, False),
    (TurnState.STOPPING, TurnEvent.RELEASED): (TurnState.ENDED, False),
    # A refused renewal while finishing is the write's own release (or its loss, which the
    # write reports itself): only a refusal outside an outcome write is a loss.
    (TurnState.HELD, TurnEvent.REFUSED): (TurnState.LOST, False),
    (TurnState.HANDLING, TurnEvent.REFUSED): (TurnState.LOST, True),
    (TurnState.HELD, TurnEvent.LOST): (TurnState.LOST, False),
    (TurnState.HANDLING, TurnEvent.LOST): (TurnState.LOST, True),
    (TurnState.FINISHING, TurnEvent.LOST): (TurnState.LOST, False),
    (TurnState.STOPPING, TurnEvent.LOST): (TurnState.LOST, False),
    (TurnState.HELD, TurnEvent.DEADLINE): (TurnState.STOPPING, False),
    (TurnState.HANDLING, TurnEvent.DEADLINE): (TurnState.STOPPING, True),
    (TurnState.FINISHING, TurnEvent.DEADLINE): (TurnState.STOPPING, False),
    (TurnState.HELD, TurnEvent.CANCELLED): (TurnState.STOPPING, False),
    (TurnState.HANDLING, TurnEvent.CANCELLED): (TurnState.STOPPING, False),
    (TurnState.FINISHING, TurnEvent.CANCELLED): (TurnState.STOPPING, False),
}

#: States in which the turn holds the lease as far as it knows (renewed, released at a stop).
HOLDING = frozenset({TurnState.HELD, TurnState.HANDLING, TurnState.FINISHING, TurnState.STOPPING})


class Turn:
    """A session held by a consumer: its lease, its task, the job begun last, and its state."""

    __slots__ = ("ctx", "expires_at", "lease", "state", "task")

    def __init__(self, lease: Lease, task: asyncio.Task[Any], expires_at: float) -> None:
        self.lease = lease
        self.task = task
        #: Monotonic time the lease lasts until, as far as this process knows (see `renewed`).
        self.expires_at = expires_at
        self.state = TurnState.HELD
        #: The job begun last (still the finished one while its outcome is written).
        self.ctx: JobContext | None = None

    def on(self, event: TurnEvent) -> bool:
        """Apply `event`; whether a row of `TRANSITIONS` applied (False: ignored)."""
        step = TRANSITIONS.get((self.state, event))
        if step is None:
            return False
        self.state, cancel = step
        if self.state is TurnState.LOST and self.ctx is not None:
            self.ctx.lease_gone()
        if cancel:
            self.task.cancel()
        return True

    def begin(self, ctx: JobContext) -> bool:
        """The job of `ctx` starts, unless the turn is stopping or lost (False)."""
        if not self.on(TurnEvent.BEGIN):
            return False
        self.ctx = ctx
        return True

    def renewed(self, expires_at: float) -> None:
        self.expires_at = expires_at

    @property
    def job_id(self) -> str | None:
        return self.ctx.job.id if self.ctx is not None else None
