"""Status sync pass: compare Substrate's actors (ListActors per configured atespace) with the
sessions in Redis, repair each drift (the table is in `reconciler.drift`) and record it.

Order matters. Sessions are surveyed first, then actors listed: a session write is fenced by the
epoch the survey saw, so any worker turn after the survey (the only thing that could make the
listed status stale) voids the write. Each repair re-reads its actor (GetActor) and acts only if
the fresh status still calls for the same repair, because ListActors may be stale or miss actors.
An actor is an orphan only when seen as one in two passes: a session created after a survey gets
its actor after that survey, so the next pass's survey (which follows the earlier list) has it.
Sessions a worker owns are never touched; they are looked at again next pass. The stuck and
orphan clocks live in memory: a new leader starts them afresh, so it waits a full threshold (or
one more pass) before acting, erring on the side of waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.actor_names import actor_name
from common.capacity import Capacity
from common.config import Config, Environment
from common.substrate import Actor, ActorStatus, NotFound, SubstrateClient, SubstrateError
from reconciler.drift import Drift, is_ours, naming_prefix, orphan_drift, session_drift
from reconciler.leader import LeaderLease
from reconciler.report import PassReport
from reconciler.store import ReconcilerStore, SessionRow

log = logging.getLogger("atefleet.reconciler.sync")

#: Substrate operations one pass runs at once (resume/suspend may each take up to ~28 s).
MAX_CONCURRENT_OPS = 8

#: Session fields each state-changing drift writes (besides the drift record itself).
_LOST_REASONS = {
    Drift.MEMORY_LOST: "memory lost: the actor fell back to its last snapshot (pod died or it "
                       "suspended on its own); processes and unsnapshotted work are gone",
    Drift.ACTOR_MISSING: "actor missing: Substrate no longer has it; its workspace is gone",
}

#: Drifts repaired on the Substrate side: they count even when the session record moved on.
_SUBSTRATE_SIDE = frozenset({Drift.STUCK_RESUMING, Drift.STUCK_SUSPENDING, Drift.DESTROY_FINISHED})

Repair = Callable[[], Awaitable[bool]]


@dataclass
class _Transit:
    """An actor seen RESUMING/SUSPENDING: since when (monotonic), in which status."""

    status: ActorStatus
    since: float


#: (atespace, actor) → since when it is RESUMING/SUSPENDING; → since when it is an orphan.
Transits = dict[tuple[str, str], _Transit]
Orphans = dict[tuple[str, str], float]


class StatusSync:
    """The pass, with what it remembers between passes: transitional actors and orphans."""

    def __init__(self, config: Config, store: ReconcilerStore, substrate: SubstrateClient,
                 leader: LeaderLease) -> None:
        self.config = config
        self.store = store
        self.substrate = substrate
        self.leader = leader
        self._transit: Transits = {}
        self._orphans: Orphans = {}
        self._ops = asyncio.Semaphore(MAX_CONCURRENT_OPS)
        self.capacity = Capacity(store.redis, config)

    async def run(self, report: PassReport) -> None:
        repairs: list[tuple[Drift, Repair]] = []
        transit: Transits = {}
        orphans: Orphans = {}
        for atespace, envs in self._atespaces().items():
            rows = [r for env in envs async for page in self.store.sessions(env.name) for r in page]
            actors = await self._list(atespace)
            report.examined += len(rows) + len(actors)
            self._track(atespace, actors, transit)
            expected = {actor_name(r.environment, r.session_id): r for r in rows}
            repairs += self._session_repairs(atespace, expected, actors, transit)
            prefixes = tuple(naming_prefix(e.name) for e in envs)
            strays = {n: a for n, a in actors.items() if n not in expected and is_ours(n, prefixes)}
            repairs += self._orphan_repairs(atespace, strays, transit, orphans)
        self._transit, self._orphans = transit, orphans
        done = await asyncio.gather(*(self._guarded(kind, fn) for kind, fn in repairs))
        for (kind, _), ok in zip(repairs, done, strict=True):
            report.repaired(kind, int(ok))

    async def _list(self, atespace: str) -> dict[str, Actor]:
        try:
            return {a.name: a async for a in self.substrate.list_actors(atespace)}
        except NotFound:
            return {}  # no such atespace (yet): it holds no actors

    def _atespaces(self) -> dict[str, list[Environment]]:
        by_space: dict[str, list[Environment]] = {}
        for env in self.config.environments:
            by_space.setdefault(env.atespace, []).append(env)
        return by_space

    # -- remembering transitional actors -----------------------------------------------------------
    def _track(self, atespace: str, actors: dict[str, Actor], transit: Transits) -> None:
        now = time.monotonic()
        for name, actor in actors.items():
            if actor.status in (ActorStatus.RESUMING, ActorStatus.SUSPENDING):
                before = self._transit.get((atespace, name))
                same = before is not None and before.status is actor.status
                transit[(atespace, name)] = before if same and before else _Transit(actor.status, now)

    def _stuck(self, atespace: str, name: str, transit: Transits) -> bool:
        seen = transit.get((atespace, name))
        return seen is not None and time.monotonic() - seen.since >= self.config.reconciler.stuck_after_s

    # -- planning --------------------------------------------------------------------------------
    def _session_repairs(self, atespace: str, expected: dict[str, SessionRow], actors: dict[str, Actor],
                         transit: Transits) -> list[tuple[Drift, Repair]]:
        out: list[tuple[Drift, Repair]] = []
        for name, row in expected.items():
            stuck = self._stuck(atespace, name, transit)
            kind = session_drift(row, actors.get(name), stuck)
            if kind is not None:
                out.append((kind, self._session_repair(kind, atespace, name, row, stuck, transit)))
        return out

    def _orphan_repairs(self, atespace: str, strays: dict[str, Actor], transit: Transits,
                        orphans: Orphans) -> list[tuple[Drift, Repair]]:
        out: list[tuple[Drift, Repair]] = []
        now = time.monotonic()
        for name, actor in strays.items():
            first = self._orphans.get((atespace, name))
            orphans[(atespace, name)] = first if first is not None else now
            if first is None:
                continue  # first sight: confirmed by the next pass's survey (module docstring)
            stuck = self._stuck(atespace, name, transit)
            kind = orphan_drift(actor, stuck, now - first, self.config.reconciler.orphan_delete_after_s)
            if kind is not None:
                out.append((kind, self._orphan_repair(kind, atespace, name, stuck, now - first)))
        return out

    # -- repairing -------------------------------------------------------------------------------
    async def _guarded(self, kind: Drift, repair: Repair) -> bool:
        async with self._ops:
            if not self.leader.held:
                return False
            try:
                return await repair()
            except SubstrateError as err:
                log.warning("drift repair failed; retried next pass", extra={"fields": {
                    "drift": kind.value, "error": f"{type(err).__name__}: {err}"}})
                return False

    async def _fresh(self, atespace: str, name: str) -> Actor | None:
        try:
            return await self.substrate.get_actor(atespace, name)
        except NotFound:
            return None

    def _session_repair(self, kind: Drift, atespace: str, name: str, row: SessionRow, stuck: bool,
                        transit: Transits) -> Repair:
        async def repair() -> bool:
            actor = await self._fresh(atespace, name)
            if session_drift(row, actor, stuck) is not kind:
                return False
            detail = await self._act(kind, atespace, name, actor, transit)
            if detail is None:
                return False
            outcome = await self.store.repair_session(self.leader.value, row, kind.value, detail,
                                                      self._fields(kind, name))
            if kind is Drift.ADOPTED and outcome == "ok":
                await self.capacity.resumed(row.session)  # a candidate for pressure parking again
            log.warning("drift repaired", extra={"fields": {
                "session": row.session, "actor": name, "drift": kind.value, "detail": detail,
                "recorded": outcome}})
            return outcome == "ok" or kind in _SUBSTRATE_SIDE
        return repair

    def _orphan_repair(self, kind: Drift, atespace: str, name: str, stuck: bool,
                       orphan_for_s: float) -> Repair:
        async def repair() -> bool:
            actor = await self._fresh(atespace, name)
            delete_after_s = self.config.reconciler.orphan_delete_after_s
            if actor is None or orphan_drift(actor, stuck, orphan_for_s, delete_after_s) is not kind:
                return False
            detail = await self._act(kind, atespace, name, actor, self._transit)  # this pass's, by now
            if detail is None:
                return False
            await self.store.record_actor_drift(self.leader.value, atespace, name, kind.value, detail)
            log.warning("orphan actor repaired", extra={"fields": {
                "atespace": atespace, "actor": name, "drift": kind.value, "detail": detail}})
            return True
        return repair

    @staticmethod
    def _fields(kind: Drift, name: str) -> dict[str, str]:
        if kind in _LOST_REASONS:
            return {"state": "lost", "lost_reason": _LOST_REASONS[kind], "lost_at": f"{time.time():.3f}"}
        if kind is Drift.ADOPTED:
            return {"state": "running", "actor": name, "last_activity": f"{time.time():.6f}"}
        if kind is Drift.SETTLED:
            return {"state": "suspended"}
        if kind is Drift.DESTROY_FINISHED:
            return {"snapshot": ""}
        return {}

    async def _act(self, kind: Drift, atespace: str, name: str, actor: Actor | None,
                   transit: Transits) -> str | None:
        """The Substrate side of a repair; a detail for the record, or None when nothing was done."""
        if kind in (Drift.STUCK_RESUMING, Drift.STUCK_SUSPENDING):
            # Restart the clock first: a retry that also hangs is retried after the threshold again.
            transit.pop((atespace, name), None)
            op = self.substrate.resume_actor if kind is Drift.STUCK_RESUMING else self.substrate.suspend_actor
            after = await op(atespace, name)
            return f"retried {kind.value.removeprefix('stuck_')}; actor now {after.status.value}"
        if kind in (Drift.DESTROY_FINISHED, Drift.ORPHAN_SUSPENDED):
            delete = kind is Drift.DESTROY_FINISHED
            return await self._suspend_then_delete(atespace, name, actor, delete)
        if kind is Drift.ORPHAN_DELETED:
            await self.substrate.delete_actor(atespace, name)
            return "orphan deleted (its snapshots with it)"
        return f"actor {'absent' if actor is None else actor.status.value}"

    async def _suspend_then_delete(self, atespace: str, name: str, actor: Actor | None,
                                   delete: bool) -> str | None:
        if actor is None:
            return None
        status = actor.status
        if status is ActorStatus.RUNNING:
            status = (await self.substrate.suspend_actor(atespace, name)).status
        if not delete:
            return f"suspended; actor now {status.value}"
        if status is not ActorStatus.SUSPENDED:
            return None  # still settling: the next pass deletes it
        await self.substrate.delete_actor(atespace, name)
        return "actor suspended and deleted (its snapshots with it)"
