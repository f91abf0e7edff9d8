"""LeaseKeeper: the sessions one Consumer holds, their lease renewal, cancel requests and losses.

All held leases are renewed together, one script call every TTL/3. A lease that renewal finds
gone (or cannot renew before it expires) is lost: the job is told (ctx.cancelled, ctx.lease_lost),
its handler is cancelled, and the loss is logged. Cancel requests arrive on one pub/sub channel;
renewals also report them, in case a message was missed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from common.metrics import LEASE_LOSSES
from common.queue.context import JobContext
from common.queue.models import TRANSIENT
from common.queue.queue import Queue
from common.queue.scripts import Lease
from common.redis.link import RedisLink

log = logging.getLogger("atefleet.queue.consumer")

#: Reconnect backoff bounds (seconds).
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


async def listen_forever(redis: Redis, channel: str, on_message: Callable[[str], None], *, name: str,
                         on_subscribed: Callable[[], Awaitable[None]] | None = None,
                         on_lost: Callable[[], None] | None = None) -> None:
    """Hand each message on `channel` (as text) to `on_message`, until cancelled.

    Any failure drops the subscription and resubscribes with backoff; `on_subscribed` runs after
    each (re)subscription so the caller can re-check what the gap may have hidden, `on_lost` when
    it drops. One such loop per process and channel (saq's multiplexer idea), never one per waiter.
    """
    link = RedisLink(redis)  # a hiredis connection of its own: a message costs a few µs, not redis-py's ~40
    backoff = BACKOFF_MIN_S

    async def subscribed() -> None:
        nonlocal backoff
        backoff = BACKOFF_MIN_S
        if on_subscribed is not None:
            await on_subscribed()

    while True:
        try:
            await link.listen(channel, on_message, subscribed)
        except Exception as err:  # resubscribe whatever happened; the caller's re-check covers the gap
            if on_lost is not None:
                on_lost()
            if not isinstance(err, TRANSIENT):
                log.exception("%s: subscription failed", name)
            log.info("%s: subscription lost (%s); resubscribing in %.2f s", name, err, backoff)
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)


@dataclass
class Turn:
    """A session held by a consumer: its lease, its task and the job running now."""

    lease: Lease
    expires_at: float  # monotonic, as far as this process knows
    task: asyncio.Task[Any] | None = None
    ctx: JobContext | None = None
    lost: bool = False
    #: The handler is running: the only time the turn's task may be cancelled (lease lost, hard
    #: stop), so that outcome writes are never interrupted half way.
    in_handler: bool = False
    #: A finishing call is in flight; it may release the lease, so a renewal that finds the lease
    #: gone meanwhile is not a loss (the finishing call itself reports a real one).
    finishing: bool = False


class LeaseKeeper:
    """Held sessions of one worker (see module docstring)."""

    def __init__(self, queue: Queue, worker_id: str, stats: dict[str, int]) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.stats = stats
        self.ttl_s = queue.lease_ttl_ms / 1000
        self.turns: dict[str, Turn] = {}

    def hold(self, turn: Turn) -> None:
        stale = self.turns.get(turn.lease.session)
        if stale is not None:
            # Our own earlier turn outlived its lease (the new epoch proves it): stop it first.
            self.lose(stale, f"session re-acquired under epoch {turn.lease.epoch}")
        self.turns[turn.lease.session] = turn

    def drop(self, turn: Turn) -> None:
        if self.turns.get(turn.lease.session) is turn:
            del self.turns[turn.lease.session]

    def lose(self, turn: Turn, why: str) -> None:
        """The lease is gone: stop this session's work here and say so."""
        if turn.lost:
            return
        turn.lost = True
        self.stats["leases_lost"] += 1
        LEASE_LOSSES.inc()
        job_id = turn.ctx.job.id if turn.ctx else None
        log.warning("lease lost: session=%s epoch=%s job=%s worker=%s (%s)",
                    turn.lease.session, turn.lease.epoch, job_id, self.worker_id, why)
        if turn.ctx is not None:
            turn.ctx.lease_lost = True
            turn.ctx.cancelled.set()
        if turn.in_handler and turn.task is not None and turn.task is not asyncio.current_task():
            turn.task.cancel()

    async def renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            turns = [t for t in self.turns.values() if not t.lost]
            if not turns:
                continue
            started = time.monotonic()
            try:
                answers = await self.queue.renew([(t.lease, t.ctx.job.id if t.ctx else None) for t in turns])
            except Exception as err:  # any failure to renew counts against the leases' expiry
                if not isinstance(err, TRANSIENT):
                    log.exception("lease renewal failed")
                self._expire_unrenewed(err)
                continue
            for turn, answer in zip(turns, answers, strict=True):
                self._apply_renewal(turn, answer, started)

    def _apply_renewal(self, turn: Turn, answer: int, started: float) -> None:
        if self.turns.get(turn.lease.session) is not turn:
            return  # the turn ended (and released) while the renewal was in flight
        if answer == 0:
            if not turn.finishing:
                self.lose(turn, "renewal found another owner or none")
            return
        turn.expires_at = started + self.ttl_s
        if answer == 2 and turn.ctx is not None:
            turn.ctx.cancelled.set()

    def _expire_unrenewed(self, err: BaseException) -> None:
        """Redis unreachable: a lease we could not renew before its expiry is lost."""
        now = time.monotonic()
        for turn in list(self.turns.values()):
            if turn.expires_at <= now:
                self.lose(turn, f"could not renew: {err}")

    async def cancel_listener(self) -> None:
        """Cancel requests on the shared channel; renewals re-check `cx` if a message is missed."""
        await listen_forever(self.queue.redis, self.queue.keys.cancel_channel, self._cancel_requested,
                             name="cancel listener")

    def _cancel_requested(self, job_id: str) -> None:
        for turn in self.turns.values():
            if turn.ctx is not None and turn.ctx.job.id == job_id:
                turn.ctx.cancelled.set()
