"""LeaseKeeper: the sessions one Consumer holds, their lease renewal, cancel requests and losses.

All held leases are renewed together, one script call every TTL/3. A lease that renewal finds
gone, or that expires here before a renewal answers, is reported to its turn
(common/queue/turn.py), which decides what the loss means where it is: a handler running is told
(ctx.cancelled, ctx.lease_lost) and cancelled, an outcome write in flight reports a real loss
itself. Losses are counted and logged here. Cancel requests arrive on one pub/sub channel;
renewals also report them, in case a message was missed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

from common.metrics import LEASE_LOSSES
from common.queue.models import TRANSIENT
from common.queue.queue import Queue
from common.queue.turn import HOLDING, Turn, TurnEvent, TurnState
from common.redis.client import RedisClient

log = logging.getLogger("atefleet.queue.consumer")

#: Reconnect backoff bounds (seconds).
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


async def listen_forever(redis: RedisClient, channel: str, on_message: Callable[[str], None], *,
                         name: str, on_subscribed: Callable[[], Awaitable[None]] | None = None,
                         on_lost: Callable[[], None] | None = None) -> None:
    """Hand each message on `channel` (as text) to `on_message`, until cancelled.

    Any failure drops the subscription and resubscribes with backoff; `on_subscribed` runs after
    each (re)subscription so the caller can re-check what the gap may have hidden, `on_lost` when
    it drops. One such loop per process and channel (saq's multiplexer idea), never one per waiter.
    """
    backoff = BACKOFF_MIN_S

    async def subscribed() -> None:
        nonlocal backoff
        backoff = BACKOFF_MIN_S
        if on_subscribed is not None:
            await on_subscribed()

    while True:
        try:
            await redis.listen(channel, on_message, subscribed)  # on a connection of its own
        except Exception as err:  # resubscribe whatever happened; the caller's re-check covers the gap
            if on_lost is not None:
                on_lost()
            if not isinstance(err, TRANSIENT):
                log.exception("%s: subscription failed", name)
            log.info("%s: subscription lost (%s); resubscribing in %.2f s", name, err, backoff)
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)


class LeaseKeeper:
    """Held sessions of one worker (see module docstring).

    It owns which turns are held and the count of losses; each turn owns its state, which the
    keeper changes only by reporting events (`Turn.on`).
    """

    def __init__(self, queue: Queue, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.ttl_s = queue.lease_ttl_ms / 1000
        self._turns: dict[str, Turn] = {}
        #: Leases this worker lost (each counted once, when its turn became LOST).
        self.losses = 0
        #: Releases of leases lost here that Redis renewed meanwhile (see _apply_renewal).
        self._releases: set[asyncio.Task[None]] = set()

    def hold(self, turn: Turn) -> None:
        stale = self._turns.get(turn.lease.session)
        if stale is not None:
            # Our own earlier turn outlived its lease (the new epoch proves it): stop it first.
            self.lose(stale, f"session re-acquired under epoch {turn.lease.epoch}")
        self._turns[turn.lease.session] = turn

    def drop(self, turn: Turn) -> None:
        if self._turns.get(turn.lease.session) is turn:
            del self._turns[turn.lease.session]

    def held(self) -> list[Turn]:
        return list(self._turns.values())

    def lose(self, turn: Turn, why: str, event: TurnEvent = TurnEvent.LOST) -> None:
        """Report a loss (`event`: LOST, or REFUSED from a renewal) to the turn; when the turn
        takes it as one, count it and say so."""
        if not turn.on(event) or turn.state is not TurnState.LOST:
            return
        self.losses += 1
        LEASE_LOSSES.inc()
        log.warning("lease lost: session=%s epoch=%s job=%s worker=%s (%s)",
                    turn.lease.session, turn.lease.epoch, turn.job_id, self.worker_id, why)

    async def renew_loop(self) -> None:
        """Renew every held lease each TTL/3 (counted from the last renewal sent). A lease whose
        expiry here passes before a renewal answers is lost then, not when the answer comes. A
        renewed lease's expiry here is counted from when the renewal was sent, so it comes no
        later than in Redis: the handler is cancelled before another worker can take the session,
        however slow Redis is (a process stalled past it cancels as soon as it runs again)."""
        period = self.ttl_s / 3
        next_at = time.monotonic() + period
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self._lose_expired("no renewal before its expiry")  # this loop ran late
            turns = [t for t in self._turns.values() if t.state in HOLDING]
            started = time.monotonic()
            next_at = started + period
            if not turns:
                continue
            try:
                answers = await self._renewed(turns)
            except Exception as err:  # any failure to renew counts against the leases' expiry
                if not isinstance(err, TRANSIENT):
                    log.exception("lease renewal failed")
                self._lose_expired(f"could not renew: {err}")
                continue
            for turn, answer in zip(turns, answers, strict=True):
                self._apply_renewal(turn, answer, started)

    async def _renewed(self, turns: list[Turn]) -> list[int]:
        """The answers to one renewal of `turns`; meanwhile each lease whose expiry passes is lost."""
        renewal = asyncio.ensure_future(self.queue.renew([(t.lease, t.job_id) for t in turns]))
        try:
            while True:
                # Looked at again at least every period: a turn taken meanwhile expires too.
                first = min((t.expires_at for t in self._turns.values() if t.state in HOLDING),
                            default=math.inf)
                wait_s = min(max(0.0, first - time.monotonic()), self.ttl_s / 3)
                done, _ = await asyncio.wait({renewal}, timeout=wait_s)
                if done:
                    return renewal.result()
                self._lose_expired("no renewal answer before its expiry")
        finally:
            renewal.cancel()  # matters only when this loop is cancelled (the worker stops)

    def _apply_renewal(self, turn: Turn, answer: int, started: float) -> None:
        if turn.state is TurnState.LOST:
            if answer:
                # Lost here at its expiry while this renewal was in flight, yet Redis renewed it:
                # nothing runs under it any more, so it is released now rather than left to
                # expire a TTL later while the session waits.
                task = asyncio.get_running_loop().create_task(self._release_lost(turn))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
            return
        if self._turns.get(turn.lease.session) is not turn:
            return  # the turn ended (and released) while the renewal was in flight
        if answer == 0:
            self.lose(turn, "renewal found another owner or none", TurnEvent.REFUSED)
            return
        turn.renewed(started + self.ttl_s)
        if answer == 2 and turn.ctx is not None:
            turn.ctx.request_cancel()

    async def _release_lost(self, turn: Turn) -> None:
        """Fenced: a no-op once the lease has expired or another epoch holds the session."""
        try:
            released = await self.queue.release(turn.lease)
        except TRANSIENT:
            return  # then it expires in Redis, as it would have
        if released:
            log.info("lease released after its loss: session=%s epoch=%s worker=%s (a renewal Redis "
                     "applied answered after its expiry here)", turn.lease.session, turn.lease.epoch,
                     self.worker_id)  # fmt: skip

    def _lose_expired(self, why: str) -> None:
        """Each held lease whose expiry here has passed is lost."""
        now = time.monotonic()
        for turn in list(self._turns.values()):
            if turn.expires_at <= now:
                self.lose(turn, why)

    async def cancel_listener(self) -> None:
        """Cancel requests on the shared channel; renewals re-check `cx` if a message is missed."""
        await listen_forever(self.queue.redis, self.queue.keys.cancel_channel, self._cancel_requested,
                             name="cancel listener")

    def _cancel_requested(self, job_id: str) -> None:
        for turn in self._turns.values():
            if turn.ctx is not None and turn.ctx.job.id == job_id:
                turn.ctx.request_cancel()
