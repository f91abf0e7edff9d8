"""The reconciler's leader lease: one active instance at a time, any number of passive standbys.

The lease is a Redis string `<instance>:<epoch>` with a PX TTL (`reconciler.leader_ttl_s`); each
new leader takes a new epoch from a counter, so the value fences: the reconciler's session writes
check it in Lua and an instance that lost the lease (paused, partitioned) cannot write. The leader
renews every TTL/3 and gives up leading as soon as a renewal fails, or when Redis has been
unreachable until the lease could have expired. Standbys sleep until the current lease would
expire (at most TTL/3 at a time) and then try, so one takes over within one TTL of the leader's
death; a leader that stops cleanly releases the lease and a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from common.queue.models import TRANSIENT
from reconciler.store import ReconcilerStore

log = logging.getLogger("atefleet.reconciler.leader")

#: Slack after the current lease's expiry before a standby tries again, seconds.
TAKEOVER_SLACK_S = 0.005
#: Pause after Redis was unreachable before trying again, seconds.
REDIS_RETRY_S = 0.5


async def wait_or_stop(stop: asyncio.Event, delay_s: float) -> bool:
    """Sleep `delay_s` unless `stop` is set first; True when stopping."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)
    return stop.is_set()


class LeaderLease:
    """This instance's view of the leader lease (see module docstring)."""

    def __init__(self, store: ReconcilerStore, instance_id: str, ttl_s: float) -> None:
        self.store = store
        self.instance_id = instance_id
        self.ttl_s = ttl_s
        #: The lease value while leading (the fencing token given to every session write).
        self.value = ""
        self._held = False
        #: Monotonic time by which the lease has certainly expired unless renewed since.
        self._expires_at = 0.0

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    @property
    def held(self) -> bool:
        """Leading now: acquired, not lost, and not past the last renewal's TTL."""
        return self._held and time.monotonic() < self._expires_at

    async def wait_until_leader(self, stop: asyncio.Event) -> bool:
        """Stay passive until this instance leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                delay_s = await self._try_acquire()
            except TRANSIENT as err:
                log.warning("redis unreachable while waiting to lead: %s", err)
                delay_s = REDIS_RETRY_S
            if self._held:
                return True
            if await wait_or_stop(stop, delay_s):
                break
        return False

    async def _try_acquire(self) -> float:
        """One attempt; when another instance leads, how long to wait before the next one."""
        sent = time.monotonic()
        acquired, value = await self.store.leader_acquire(self.instance_id, self.ttl_ms)
        if acquired:
            self.value, self._held, self._expires_at = value, True, sent + self.ttl_s
            log.info("reconciler leading", extra={"fields": {"lease": value}})
            return 0.0
        pttl_ms = await self.store.leader_pttl_ms()
        return min(max(pttl_ms / 1000, 0.0) + TAKEOVER_SLACK_S, self.ttl_s / 3)

    async def keep(self) -> None:
        """Renew every TTL/3 while leading; returns when the lease is lost."""
        while self._held:
            await asyncio.sleep(self.ttl_s / 3)
            sent = time.monotonic()
            try:
                renewed = await self.store.leader_renew(self.value, self.ttl_ms)
            except TRANSIENT as err:
                if time.monotonic() >= self._expires_at:
                    self._lose(f"redis unreachable past the lease TTL: {err}")
                continue
            if renewed:
                self._expires_at = sent + self.ttl_s
            else:
                self._lose("renewal found another leader or none")

    def _lose(self, why: str) -> None:
        self._held = False
        log.warning("reconciler leadership lost", extra={"fields": {"lease": self.value, "why": why}})

    async def release(self) -> None:
        """Give the lease up (graceful stop) so a standby takes over without waiting the TTL."""
        if not self._held:
            return
        self._held = False
        with contextlib.suppress(*TRANSIENT):
            await self.store.leader_release(self.value)
        log.info("reconciler leadership released", extra={"fields": {"lease": self.value}})
