"""The reconciler's Redis side: its own keys, its Lua scripts, and one typed method per script.

Every key name (sessions, leases, FIFOs, `events`, the leader lease and its fencing epoch) comes
from `common.queue.keys.Keys`: the scripts (`lua/`) declare the keys they take and go through the
fleet's script registry (common/redis/scripts.py), like the queue's.
Every write to a session is fenced three ways (see `repair_session.lua`): this instance still
leads, no worker holds the session's lease, and the session's epoch and state are the ones the
survey saw.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from common.queue.keys import Keys, session_name
from common.queue.models import text
from common.queue.scripts import EVENTS_MAXLEN
from common.redis.client import RedisClient
from common.redis.link import RedisArg
from common.redis.scripts import ScriptRunner, load_script

SCRIPT_NAMES = ("survey", "repair_session", "actor_drift", "leader_acquire", "leader_renew",
                "leader_release", "gc_keys", "prune_index")

#: Sessions read per survey script call: bounds how long one call blocks Redis (~1-2 ms).
SURVEY_PAGE = 500


@dataclass(frozen=True)
class SessionRow:
    """One session as the survey saw it (one script call, so a consistent snapshot of it)."""

    environment: str
    session_id: str
    state: str
    last_activity: float | None
    epoch: str
    snapshot_kept: bool
    #: Jobs in the FIFO, the running one included.
    queued: int
    #: A worker holds the session's lease.
    leased: bool
    #: The session hash exists (False: a stale index member).
    exists: bool

    @property
    def session(self) -> str:
        return session_name(self.environment, self.session_id)


def _float_or_none(value: str) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _rows(environment: str, flat: Sequence[Any]) -> list[SessionRow]:
    rows = []
    for i in range(0, len(flat), 8):
        sid, state, last, epoch, kept, queued, leased, exists = flat[i : i + 8]
        rows.append(SessionRow(
            environment=environment, session_id=text(sid), state=text(state),
            last_activity=_float_or_none(text(last)), epoch=text(epoch), snapshot_kept=text(kept) == "1",
            queued=int(queued), leased=int(leased) == 1, exists=int(exists) == 1,
        ))
    return rows


@dataclass(frozen=True)
class GcFixes:
    """What one `gc_keys` call repaired."""

    job_ttls: int = 0
    output_ttls: int = 0
    secrets_deleted: int = 0
    idempotency_ttls: int = 0


class ReconcilerStore:
    """Typed calls of the reconciler's scripts (see module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        prelude = f"local EVENTS_MAXLEN = {EVENTS_MAXLEN}\n"
        self._s = {name: load_script("reconciler", name, keys, prelude) for name in SCRIPT_NAMES}
        self._runner = ScriptRunner(redis.execute)

    async def _run(self, name: str, args: Sequence[RedisArg], of: Sequence[Any] = (),
                   each: Sequence[Sequence[Any]] = ()) -> Any:
        return await self._runner.call(self._s[name], of, each, args)

    # -- sessions --------------------------------------------------------------------------------
    async def survey(self, environment: str, cursor: str = "", count: int = SURVEY_PAGE
                     ) -> tuple[list[SessionRow], str | None]:
        """One page of the environment's sessions after `cursor`; (rows, next cursor or None)."""
        flat = await self._run("survey", [session_name(environment, ""), cursor, count], (environment,))
        rows = _rows(environment, flat)
        return rows, (rows[-1].session_id if len(rows) == count else None)

    async def sessions(self, environment: str, page: int = SURVEY_PAGE) -> AsyncIterator[list[SessionRow]]:
        """Every session of the environment, page by page (each page one script call)."""
        cursor: str | None = ""
        while cursor is not None:
            rows, cursor = await self.survey(environment, cursor, page)
            if rows:
                yield rows

    async def repair_session(self, leader: str, row: SessionRow, kind: str, detail: str,
                             fields: dict[str, str] | None = None) -> str:
        """Set `fields` and record the drift, fenced (see repair_session.lua); 'ok' when written."""
        session = row.session
        now = time.time()
        args: list[RedisArg] = [leader, row.epoch, row.state, session, kind, detail,
                                int(now * 1000), f"{now:.3f}"]
        for name, value in (fields or {}).items():
            args += [name, value]
        return text(await self._run("repair_session", args, (session,)))

    async def record_actor_drift(self, leader: str, atespace: str, actor: str, kind: str,
                                 detail: str) -> bool:
        """An `events` entry for a drift of an actor without a session; False if not the leader."""
        raw = await self._run("actor_drift", [leader, atespace, actor, kind, detail, int(time.time() * 1000)])
        return int(raw) == 1

    async def prune_index(self, environment: str, session_ids: Sequence[str]) -> int:
        if not session_ids:
            return 0
        raw = await self._run("prune_index", session_ids, (environment,),
                              [(session_name(environment, sid),) for sid in session_ids])
        return int(raw)

    # -- leader lease ----------------------------------------------------------------------------
    async def leader_acquire(self, instance: str, ttl_ms: int) -> tuple[bool, str]:
        """(True, our value) when we became leader, else (False, the current leader's value)."""
        raw = await self._run("leader_acquire", [instance, ttl_ms])
        return int(raw[0]) == 1, text(raw[1])

    async def leader_renew(self, value: str, ttl_ms: int) -> bool:
        return int(await self._run("leader_renew", [value, ttl_ms])) == 1

    async def leader_release(self, value: str) -> bool:
        return int(await self._run("leader_release", [value])) == 1

    async def leader_pttl_ms(self) -> int:
        """Remaining lease time of whoever leads (-2: nobody)."""
        return int(await self.redis.pttl(self.keys.reconciler_leader))

    async def leader_value(self) -> str | None:
        raw = await self.redis.get(self.keys.reconciler_leader)
        return text(raw) if raw is not None else None

    # -- garbage collection ----------------------------------------------------------------------
    async def gc_keys(self, batch: Sequence[tuple[str, str, str]], job_ttl_ms: int,
                      idem_ttl_ms: int, output_ttl_ms: int) -> GcFixes:
        """batch = (kind letter, key, job key); see gc_keys.lua."""
        if not batch:
            return GcFixes()
        kinds = "".join(kind for kind, _, _ in batch)
        raw = await self._run("gc_keys", [kinds, job_ttl_ms, idem_ttl_ms, output_ttl_ms],
                              each=[(key, job) for _, key, job in batch])
        return GcFixes(*(int(x) for x in raw))
