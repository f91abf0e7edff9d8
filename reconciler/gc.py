"""Garbage collection pass: what Redis TTLs cannot clean on their own.

Terminal jobs, their results and output streams, and idempotency keys expire by the TTLs the
queue sets; this pass verifies that (a key that missed its TTL gets one, secrets of a finished or
vanished job are deleted), trims `events` entries older than `jobs.events_ttl_s` and `callbacks`
and `dlq` entries older than the job TTL (the streams are otherwise only capped by length), and
drops session-index members whose session hash is gone. The keyspace is walked with SCAN in
bounded slices that resume where the last pass stopped. Snapshots of destroyed sessions go with
their actor (status sync finishes such destroys).
"""

from __future__ import annotations

import re
import time

from common.config import Config
from common.queue import Queue
from common.queue.models import text
from reconciler.report import PassReport
from reconciler.store import ReconcilerStore

#: Keys one SCAN call asks for; keys examined per pass at most (the rest wait for the next pass).
SCAN_COUNT = 1000
SCAN_BUDGET = 50_000

_GLOB = re.compile(r"([*?\[\]\\])")


class GcPass:
    """Keeps the SCAN cursor between passes."""

    def __init__(self, config: Config, queue: Queue, store: ReconcilerStore) -> None:
        self.config = config
        self.queue = queue
        self.store = store
        keys = queue.keys
        #: Key prefix → kind letter of gc_keys.lua.
        self._kinds = {keys.job(""): "j", keys.output(""): "o", keys.secrets(""): "s",
                       keys.idempotency("", "")[:-1]: "i"}
        self._cursor = 0

    async def run(self, report: PassReport) -> None:
        await self._keys(report)
        await self._index(report)
        await self._events(report)

    def _classify(self, key: str) -> tuple[str, str, str] | None:
        """(kind, key, job key) for a key gc_keys.lua checks, else None."""
        for prefix, kind in self._kinds.items():
            if key.startswith(prefix):
                job = self.queue.keys.job(key[len(prefix):]) if kind in "os" else key
                return kind, key, job
        return None

    async def _keys(self, report: PassReport) -> None:
        pattern = _GLOB.sub(r"\\\1", self.queue.keys.prefix) + "*"
        examined = 0
        while examined < SCAN_BUDGET:
            self._cursor, found = await self.queue.redis.scan(self._cursor, match=pattern, count=SCAN_COUNT)
            examined += len(found)
            batch = [c for c in (self._classify(text(k)) for k in found) if c is not None]
            jobs = self.config.jobs
            fixes = await self.store.gc_keys(batch, int(jobs.ttl_s * 1000),
                                             int(jobs.idempotency_ttl_s * 1000),
                                             int(jobs.output_ttl_s * 1000))
            report.repaired("job_ttl_set", fixes.job_ttls)
            report.repaired("output_ttl_set", fixes.output_ttls)
            report.repaired("secrets_deleted", fixes.secrets_deleted)
            report.repaired("idempotency_ttl_set", fixes.idempotency_ttls)
            if self._cursor == 0:
                break
        report.examined += examined

    async def _index(self, report: PassReport) -> None:
        for env in self.config.environments:
            async for rows in self.store.sessions(env.name):
                stale = [r.session_id for r in rows if not r.exists and not r.queued]
                report.repaired("stale_index_entries", await self.store.prune_index(env.name, stale))

    async def _events(self, report: PassReport) -> None:
        # Stream ids are `<ms>-<seq>`: MINID drops entries older than their retention. Exact, not
        # `~`: an approximate trim keeps a whole node while any entry in it is young, i.e.
        # forever on a quiet fleet; once a minute the exact one is cheap. `events` keeps
        # `jobs.events_ttl_s`; `callbacks` and `dlq` name jobs, useless once the records expire.
        keys, jobs, now = self.queue.keys, self.config.jobs, time.time()
        for name, stream, keep_s in (("events_trimmed", keys.events, jobs.events_ttl_s),
                                     ("callbacks_trimmed", keys.callbacks, jobs.ttl_s),
                                     ("dlq_trimmed", keys.dlq, jobs.ttl_s)):
            oldest_ms = int((now - keep_s) * 1000)
            trimmed = await self.queue.redis.xtrim(stream, minid=f"{oldest_ms}-0", approximate=False)
            report.repaired(name, int(trimmed))
