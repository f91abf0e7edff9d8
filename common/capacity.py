"""Capacity in Redis: which sessions run, which the fleet parked, and the fair wait for a worker.

Substrate has far fewer workers (local slots) than a fleet has sessions. A resume that finds none
free joins one first-come-first-served queue across all sessions and workers (`capacity:wait`)
and, through `turn`, picks the running session idle longest to park (pressure parking). The park
itself is a `suspend_if_idle` job on the victim's own FIFO, so it never overtakes a call of that
session. Only the first `ADMIT_WINDOW` waiters ask Substrate for a worker; the others keep their
place. A worker freed by a suspend goes to the waiter first in line not told of one yet
(`tell`), in whichever worker process it waits: that one asks Substrate at once. The worker side
(`workers.actors`) drives this; the API reads `view` for GET /v1/capacity.

These keys are indexes, not fenced records: every reader tolerates a stale member (the turn
script drops `running` members whose session is no longer running; `parking` entries lapse).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from common.config import Config
from common.queue.keys import Keys
from common.queue.models import text
from common.redis.client import RedisClient
from common.redis.scripts import ScriptRunner, load_script

#: Waiters at these first places of the queue ask Substrate for a worker; the rest wait their turn.
ADMIT_WINDOW = 4
#: A park requested this long ago and not finished is forgotten (its worker died; queue repair
#: re-runs the job): longer than a suspend may take (Substrate's lifecycle deadline).
PARK_LAPSE_MS = 60_000
#: Parks per minute are counted over this window.
PARK_RATE_WINDOW_MS = 60_000


class SuspendedBy(StrEnum):
    """Who suspended a session (the session's `suspended_by`). Only a client's suspend makes a
    later call without `auto_resume` answer 409; the fleet's own parks are woken by the call."""

    CLIENT = "client"
    AUTO_RESUME = "auto_resume"
    IDLE = "idle"
    PRESSURE = "pressure"


#: The fleet's own parks: invisible to clients except in latency.
FLEET_PARKS = frozenset({SuspendedBy.AUTO_RESUME, SuspendedBy.IDLE, SuspendedBy.PRESSURE})
#: Session states a suspended session is in: parked, being parked (a worker may have died
#: midway), or being woken (a wake that found no worker in time leaves it "resuming").
PARKED_STATES = ("suspended", "suspending", "resuming")


@dataclass(frozen=True)
class Turn:
    """Where a waiting resume stands: its place (0 = first), a session it should park now, and
    whether the park it asked for last is still in flight."""

    rank: int
    park: str | None
    park_in_flight: bool = False

    @property
    def admitted(self) -> bool:
        return self.rank < ADMIT_WINDOW


def now_ms() -> int:
    return int(time.time() * 1000)


class Capacity:
    """The capacity indexes of one fleet (one Redis, one prefix)."""

    def __init__(self, redis: RedisClient, config: Config) -> None:
        self.redis = redis
        self.config = config
        self.keys = Keys(config.redis_prefix)
        self._turn = load_script("common", "capacity_turn", self.keys)
        self._tell = load_script("common", "capacity_tell", self.keys)
        self._scripts = ScriptRunner(redis.execute)
        self._background_ok = [e.name for e in config.environments if e.suspend_with_background]

    async def full_or_waiting(self) -> bool:
        """Whether a resume should join the wait queue rather than ask Substrate first: resumes
        wait already, or as many sessions run as Substrate last showed workers (an index that
        can lag behind a park by a moment: the queue then admits the resume at once)."""
        k = self.keys
        waiting, running, total = await asyncio.gather(
            self.redis.zcard(k.capacity_wait), self.redis.zcard(k.running),
            self.redis.hget(k.capacity_workers, "total"))
        return int(waiting) > 0 or (total is not None and int(running) >= int(text(total)))

    async def turn(self, session: str, since_ms: int | None = None, parking: str | None = None,
                   joining: bool = False) -> Turn:
        """Join the wait queue at `since_ms` (when the waiting job was created: first come, first
        served; now by default), or keep the place; maybe get a session to park (see the script).
        `parking`: the session this waiter asked to park last (no other while it is in flight);
        `joining`: its first turn (a told mark an earlier run of its job left is dropped)."""
        now = now_ms()
        rank, park, in_flight = await self._scripts.call(self._turn, args=[
            session, now, since_ms or now, int(self.config.workers.min_idle_s * 1000), PARK_LAPSE_MS,
            2 * ADMIT_WINDOW, parking or "", int(joining), *self._background_ok])
        return Turn(int(rank), text(park) or None, bool(int(in_flight)))

    async def tell(self, handed: tuple[str, int] | None = None) -> tuple[str, int] | None:
        """A Substrate worker was freed (or a park's suspend is freeing one): the waiter it goes
        to, now marked told, and when (unix ms); or None (see capacity_tell.lua). `handed`: the
        waiter the park told as its suspend began, and when, if it did."""
        now = now_ms()
        session, at = handed or ("", 0)
        told = text(await self._scripts.call(self._tell, args=[now, session, at]))
        return (told, now) if told else None

    async def announce_told(self, session: str) -> None:
        """Tell the worker processes that `session` was told (the one where it waits wakes it)."""
        await self.redis.publish(self.keys.told_channel, session)

    async def refused(self, session: str) -> None:
        """A told waiter's resume was refused (another took the worker): it may be told again."""
        await self.redis.zrem(self.keys.capacity_told, session)

    async def waiting(self) -> bool:
        """Whether any resume waits for a worker."""
        return int(await self.redis.zcard(self.keys.capacity_wait)) > 0

    async def position(self, session: str) -> tuple[int, float] | None:
        """(place in the wait queue, unix s it started waiting), or None when it does not wait."""
        rank, since = await asyncio.gather(self.redis.zrank(self.keys.capacity_wait, session),
                                           self.redis.zscore(self.keys.capacity_wait, session))
        return None if rank is None or since is None else (rank, since / 1000)

    async def leave(self, session: str) -> None:
        await asyncio.gather(self.redis.zrem(self.keys.capacity_wait, session),
                             self.redis.zrem(self.keys.capacity_told, session))

    async def resumed(self, session: str) -> None:
        """The session's actor runs: a park candidate from now on; no longer waiting or parked."""
        await asyncio.gather(self.redis.zadd(self.keys.running, {session: now_ms()}),
                             self.redis.zrem(self.keys.parked, session),
                             self.redis.zrem(self.keys.capacity_wait, session),
                             self.redis.zrem(self.keys.capacity_told, session))

    async def suspended(self, session: str, by: SuspendedBy, job_id: str) -> None:
        """The session's actor was suspended by `by` (a fleet park is counted and woken by a call)."""
        now = now_ms()
        r = self.redis
        if by in FLEET_PARKS:
            await asyncio.gather(r.zrem(self.keys.running, session), r.zadd(self.keys.parked, {session: now}),
                                 r.zadd(self.keys.parks, {job_id: now}),
                                 r.zremrangebyscore(self.keys.parks, "-inf", now - PARK_RATE_WINDOW_MS))
        else:
            await asyncio.gather(r.zrem(self.keys.running, session), r.zrem(self.keys.parked, session))

    async def park_finished(self, session: str) -> None:
        """A pressure park of `session` ended (parked or declined): no longer in flight."""
        await self.redis.zrem(self.keys.parking, session)

    async def forget(self, *sessions: str) -> None:
        """Sessions that are not parked (the reconciler's pass, after a drift or destroy)."""
        if sessions:
            await self.redis.zrem(self.keys.parked, *sessions)

    async def publish_workers(self, total: int, busy: int) -> None:
        """Substrate's workers as ListWorkers last showed them (the reconciler's leader)."""
        await self.redis.hset(self.keys.capacity_workers, {"total": total, "busy": busy, "at": now_ms()})

    async def view(self) -> dict[str, Any]:
        """The GET /v1/capacity body (see docs/architecture.md, "Capacity")."""
        now = now_ms()
        k = self.keys
        r = self.redis
        workers_raw, oldest, (running, parked, waiting, parking, parks) = await asyncio.gather(
            r.hgetall(k.capacity_workers), r.zrange_withscores(k.capacity_wait, 0, 0),
            asyncio.gather(r.zcard(k.running), r.zcard(k.parked), r.zcard(k.capacity_wait),
                           r.zcard(k.parking), r.zcount(k.parks, now - PARK_RATE_WINDOW_MS, "+inf")))
        workers = {text(a): int(text(b)) for a, b in workers_raw.items()}
        total, busy = workers.get("total"), workers.get("busy")
        return {
            "workers": {
                "total": total, "busy": busy,
                "free": None if total is None or busy is None else max(total - busy, 0),
                "observed_at_ms": workers.get("at"),
            },
            "sessions": {"running": int(running), "parked": int(parked), "waiting": int(waiting)},
            "wait_queue": {
                "length": int(waiting),
                "oldest_wait_s": round((now - oldest[0][1]) / 1000, 3) if oldest else 0.0,
                "admit_window": ADMIT_WINDOW,
            },
            "parks": {"in_flight": int(parking), "per_minute": int(parks)},
            "min_idle_s": self.config.workers.min_idle_s,
            "capacity_wait_s": self.config.workers.capacity_wait_s,
        }
