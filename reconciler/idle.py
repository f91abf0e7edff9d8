"""Idle pass: ask idle sessions to suspend, through their own FIFO; count sessions by state.

A session is idle when it is `running`, its last activity (a job's start or finish, as the
worker records it) is older than its environment's `idle_timeout_s` (0 = never), and it has no
queued or running job and no owner. It then gets a `suspend_if_idle` job like any other job;
the worker re-checks all of that (and background processes) under the lease, so a call that
reaches the FIFO first wins and the idle job is skipped.

A session the worker declined to suspend (say, a background process runs) keeps the same
activity stamp; it is asked again only after another `idle_timeout_s`, not every period.

The pass also drops from the fleet's parked index (common.capacity) the sessions that are not
suspended any more (adopted by status sync, lost, destroyed): GET /v1/capacity counts it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from common.capacity import PARKED_STATES, Capacity
from common.config import Config
from common.metrics import QUEUE_DEPTH, SESSIONS_BY_STATE
from common.queue import JobKind, NewJob, Queue
from reconciler.report import PassReport
from reconciler.store import ReconcilerStore, SessionRow

#: Principal recorded on the jobs the reconciler enqueues.
PRINCIPAL = "reconciler"

#: Session states the gauge always reports (0 when none), so a state that empties shows 0.
SESSION_STATES = ("new", "resuming", "running", "suspending", "suspended", "destroying", "destroyed", "lost")


@dataclass(frozen=True)
class _Asked:
    """An idle job already enqueued for this activity stamp, and when."""

    stamp: float
    at: float


class IdlePass:
    """Keeps, across passes, which sessions were already asked for which activity stamp."""

    def __init__(self, config: Config, queue: Queue, store: ReconcilerStore) -> None:
        self.config = config
        self.queue = queue
        self.store = store
        self.capacity = Capacity(queue.redis, config)
        self._asked: dict[str, _Asked] = {}

    async def run(self, report: PassReport) -> None:
        now = time.time()
        states: Counter[str] = Counter()
        depth = 0
        asked: dict[str, _Asked] = {}
        for env in self.config.environments:
            async for rows in self.store.sessions(env.name):
                report.examined += len(rows)
                states.update(r.state or "new" for r in rows if r.exists)
                depth += sum(r.queued for r in rows)
                idle = [r for r in rows if self._due(r, env.idle_timeout_s, now, asked)]
                await self._ask(idle, env.idle_timeout_s, now, asked)
                report.repaired("idle_suspend_requested", len(idle))
                await self.capacity.forget(*(r.session for r in rows if r.state not in PARKED_STATES))
        # Only sessions still idle stay remembered: the memo is bounded by the idle sessions.
        self._asked = asked
        for state in {*SESSION_STATES, *states}:
            SESSIONS_BY_STATE.labels(state=state).set(states.get(state, 0))
        QUEUE_DEPTH.set(depth)

    def _due(self, row: SessionRow, timeout_s: float, now: float, asked: dict[str, _Asked]) -> bool:
        """Idle past the timeout, no job, no owner, and not already asked for this stamp lately."""
        last = row.last_activity or 0.0
        before = self._asked.get(row.session)
        remembered = before is not None and before.stamp == last and row.state == "running"
        if remembered and before is not None:
            asked[row.session] = before  # still the same idle stretch: keep remembering it
        if not timeout_s or row.state != "running" or row.queued or row.leased or now - last < timeout_s:
            return False
        return not (remembered and before is not None and now - before.at < timeout_s)

    async def _ask(self, rows: list[SessionRow], timeout_s: float, now: float,
                   asked: dict[str, _Asked]) -> None:
        if not rows:
            return
        jobs = [
            NewJob(environment=r.environment, session_id=r.session_id, kind=JobKind.SUSPEND_IF_IDLE,
                   payload={"idle_timeout_s": timeout_s, "last_activity": r.last_activity},
                   principal=PRINCIPAL)
            for r in rows
        ]
        await self.queue.enqueue_batch(jobs)
        for r in rows:
            asked[r.session] = _Asked(r.last_activity or 0.0, now)
