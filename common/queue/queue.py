"""Queue: the durable per-session FIFO job queue on one Redis.

The API side enqueues (single or batch, idempotent), reads jobs, cancels, reads output and sessions.
The worker side (normally through `Consumer`) is handed sessions, each with its lease and head job
(taken from `ready`, or pushed to the worker's inbox while it waits with free slots announced),
completes/fails/retries fenced by the lease, and releases. The reconciler calls the repair
primitives. Bookkeeping (ids, fingerprints, backoff, config) lives here; storage work is one Lua
script per operation in `QueueScripts`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any

from common.config import Config, QuotaLimits
from common.queue.compact import compact_json, decode_result, encode_result, fold_output, unfold_output
from common.queue.keys import Keys, session_name
from common.queue.models import (
    PROBLEM_CANCELLED,
    PROBLEM_RETRIES_EXHAUSTED,
    EnqueueResult,
    JobRecord,
    JobState,
    NewJob,
    text,
)
from common.queue.output import OutputLimits, fit_result
from common.queue.scripts import EVENTS_MAXLEN, Handoff, Lease, QueueScripts, ScriptLimits
from common.redis.client import RedisClient

#: Lifetime of an output stream that holds only the end marker (the job wrote no output but a
#: reader was blocked on it): long enough to wake that reader; later ones see the terminal record.
END_MARKER_TTL_MS = 10_000



#: Session hash fields the queue owns; `update_session` refuses them.
RESERVED_SESSION_FIELDS = frozenset({"epoch", "nid"})

OutputEntry = tuple[str, dict[str, str]]


def now_ms() -> int:
    return int(time.time() * 1000)


def new_job_id() -> str:
    """Creation time (unix ms, 11 hex digits) + 64 random bits: unguessable, sortable by age, and
    telling an expired job (an id older than the TTL) from one that never existed."""
    return f"{now_ms():011x}{os.urandom(8).hex()}"


def job_id_created_s(job_id: str) -> float | None:
    """The creation time (unix s) encoded in a job id, or None if it is not one of ours."""
    if len(job_id) != 27:
        return None
    try:
        return int(job_id[:11], 16) / 1000
    except ValueError:
        return None


def fingerprint_of(job: NewJob) -> str:
    """What makes two requests "the same" for idempotency: everything but secret values."""
    doc = {
        "session": job.session,
        "kind": str(job.kind),
        "payload": job.payload,
        "callback_url": job.callback_url,
        "callback_secret_id": job.callback_secret_id,
        "secret_names": sorted(job.secrets or {}),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Queue:
    """The queue's async API over the process's Redis client (see module docstring).

    `end_marker_ttl_ms` and `events_maxlen` are tuning knobs with sensible defaults; everything
    else comes from `config` (prefix, lease TTL, job TTLs, output cap, retry policy).
    """

    def __init__(
        self, redis: RedisClient, config: Config, end_marker_ttl_ms: int = END_MARKER_TTL_MS,
        events_maxlen: int = EVENTS_MAXLEN,
    ) -> None:
        self.redis = redis
        self.config = config
        self.keys = Keys(config.redis_prefix)
        self.lease_ttl_ms = int(config.workers.lease_ttl_s * 1000)
        self.output_limits = OutputLimits.of(config.jobs)
        self.scripts = QueueScripts(redis.execute, self.keys, ScriptLimits(
            ttl_ms=int(config.jobs.ttl_s * 1000),
            end_ttl_ms=end_marker_ttl_ms,
            output_ttl_ms=int(config.jobs.output_ttl_s * 1000),
            fold_max_bytes=config.jobs.output_fold_max_bytes,
            output_maxlen=config.jobs.output_stream_maxlen,
            lease_ttl_ms=self.lease_ttl_ms,
            idempotency_ttl_ms=int(config.jobs.idempotency_ttl_s * 1000),
            events_maxlen=events_maxlen,
        ))

    # -- API side --------------------------------------------------------------------------------
    async def enqueue(
        self, job: NewJob, idempotency_key: str | None = None, fingerprint: str | None = None,
        job_id: str | None = None, quotas: QuotaLimits | None = None,
    ) -> EnqueueResult:
        """Record the job and append it to its session's FIFO; raises IdempotencyConflict, and
        for a job with a `tenancy`, SessionNotOwned and QuotaRefused (`quotas` of its principal).

        `job_id` (from `new_job_id()`) lets the caller know the id before the job exists, e.g. to
        watch it with a JobWaiter first."""
        (result,) = await self.enqueue_batch([job], [idempotency_key], [fingerprint],
                                             None if job_id is None else [job_id], quotas)
        return result

    async def enqueue_batch(
        self,
        jobs: Sequence[NewJob],
        idempotency_keys: Sequence[str | None] | None = None,
        fingerprints: Sequence[str | None] | None = None,
        job_ids: Sequence[str] | None = None,
        quotas: QuotaLimits | None = None,
    ) -> list[EnqueueResult]:
        """All jobs in one script: all or none; per-session order = list order. Jobs with a
        `tenancy` are owner-checked, counted against `quotas` and audited (see enqueue.lua)."""
        if not jobs:
            return []
        idem = list(idempotency_keys or [None] * len(jobs))
        prints = list(fingerprints or [None] * len(jobs))
        ids = list(job_ids or [new_job_id() for _ in jobs])
        # A fingerprint only matters with an idempotency key; hashing is skipped otherwise.
        rows = [
            (ids[i], job, idem[i], prints[i] or (fingerprint_of(job) if idem[i] else ""))
            for i, job in enumerate(jobs)
        ]
        created_ms = now_ms()
        done = await self.scripts.enqueue(rows, created_ms, quotas, self.config.audit.stream_maxlen)
        return [
            EnqueueResult(jid, created, JobRecord.queued(jid, jobs[i], created_ms) if created else None)
            for i, (jid, created) in enumerate(done)
        ]

    async def get_job(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.hgetall(self.keys.job(job_id))
        return JobRecord.from_fields(job_id, raw) if raw else None

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Queued: removed from its FIFO, cancelled. Running: flagged; its worker is told."""
        problem = {"type": PROBLEM_CANCELLED, "title": "Job cancelled", "status": 409,
                   "detail": "cancelled on request before it started"}
        outcome = await self.scripts.cancel(job_id, now_ms(), problem)
        if outcome == "missing":
            return None
        return await self.get_job(job_id)

    async def read_output(
        self, job_id: str, after: str = "0-0", block_ms: int = 0, count: int = 1000
    ) -> list[OutputEntry]:
        """Output entries after `after` (`{"stream", "data"}`, finally `{"event": "end"}`).

        With block_ms > 0, waits up to that long for the next entries (one connection while
        blocked). An unknown job has no entries. A finished job
        without a stream (output folded into its record, or its stream expired) answers from the
        record (`_folded`).
        """
        key = self.keys.output(job_id)
        entries = await self.redis.xrange(key, min=f"({after}", count=count)
        if entries:
            return _entries(entries)
        if await self.redis.exists(key):
            return await self._block_on_output(key, after, block_ms, count)
        job = await self.get_job(job_id)
        if job is None:
            return []
        if not job.terminal and block_ms > 0:
            # Ask for an end marker in case the job ends without output while we block (finish
            # writes one only for watched jobs), then re-check: it may have ended meanwhile.
            await self.redis.hset(self.keys.job(job_id), {"ow": "1"})
            job = await self.get_job(job_id)
            if job is None:
                return []
        if job.terminal and not await self.redis.exists(key):
            return await self._folded(job_id, after)
        return await self._block_on_output(key, after, block_ms, count)

    async def _folded(self, job_id: str, after: str) -> list[OutputEntry]:
        """The output `complete` folded into the record (`o`), as entries `0-1`, `0-2`, ..., then
        the end marker; after an id of a real stream (since expired), only the end marker."""
        raw, result = await self.redis.hmget(self.keys.job(job_id), ["o", "res"])
        flat = unfold_output(text(raw) if raw else None, decode_result(text(result) if result else None))
        entries: list[OutputEntry] = [
            (f"0-{i // 2 + 1}", {"stream": flat[i], "data": flat[i + 1]}) for i in range(0, len(flat), 2)
        ]
        entries.append((f"0-{len(entries) + 1}", {"event": "end"}))
        ms, _, seq = after.partition("-")
        if ms != "0":
            return entries[-1:]
        return entries[int(seq or 0):]

    async def _block_on_output(self, key: str, after: str, block_ms: int, count: int) -> list[OutputEntry]:
        if block_ms <= 0:
            return []
        got = await self.redis.xread({key: after}, count=count, block_ms=block_ms)
        return _entries(got[0][1]) if got else []

    async def get_session(self, environment: str, session_id: str) -> dict[str, str] | None:
        raw = await self.redis.hgetall(self.keys.session(session_name(environment, session_id)))
        return {text(k): text(v) for k, v in raw.items()} or None

    async def list_sessions(
        self, environment: str, cursor: str = "", count: int = 100
    ) -> tuple[list[str], str | None]:
        """Session ids in lexical order after `cursor`; (page, next cursor or None at the end)."""
        low = f"({cursor}" if cursor else "-"
        raw = await self.redis.zrangebylex(self.keys.session_index(environment), low, "+", start=0, num=count)
        page = [text(x) for x in raw]
        return page, (page[-1] if len(page) == count else None)

    async def queue_depth(self, environment: str, session_id: str) -> int:
        """Jobs in the session's FIFO, the running one included."""
        return await self.redis.llen(self.keys.fifo(session_name(environment, session_id)))

    async def head_job(self, environment: str, session_id: str) -> JobRecord | None:
        """The job at the head of the session's FIFO (running, or next to run), if any."""
        jid = await self.redis.lindex(self.keys.fifo(session_name(environment, session_id)), 0)
        return await self.get_job(text(jid)) if jid else None

    async def forget_session(self, environment: str, session_id: str) -> bool:
        """Delete an idle session's hash and index entry (GC after destroy); False if busy."""
        return await self.scripts.forget_session(environment, session_id)

    async def record_webhook_attempt(self, job_id: str, attempt: dict[str, Any]) -> int:
        """Append a delivery attempt to the job record; the count, or 0 when the job is gone."""
        return await self.scripts.record_webhook(job_id, attempt)

    # -- worker side -----------------------------------------------------------------------------
    async def load_scripts(self) -> None:
        """Load every script now (a worker's start-up; callers that skip it load each on first use)."""
        await self.scripts.load()

    async def take_work(
        self, worker_id: str, slots: int, *, announce_s: float = 0.0, free: int | None = None
    ) -> list[Handoff]:
        """Take up to `slots` sessions waiting in `ready` (each with its lease and head job).

        With `announce_s`, the slots left unfilled are announced for that long: sessions becoming
        ready meanwhile are handed to this worker's inbox (`wait_handoffs`). A worker renews the
        announcement by calling again, with `slots` = the free slots it has not announced yet
        (0 when none). When it had no live announcement (its first call, or one that lapsed and
        may have been forgotten with its inbox), all its `free` slots (default `slots`) count.
        """
        return await self.scripts.take_work(
            worker_id, slots, now_ms(), int(announce_s * 1000), slots if free is None else free
        )

    async def wait_handoffs(self, worker_id: str, block_s: float) -> list[Handoff]:
        """Sessions handed to this worker; blocks up to block_s for the first, [] on timeout.

        The BLPOP goes over one of the client's blocking connections, never over the pipelined
        one it would hold up. An empty entry (a wake-up from `retire`) gives [].
        """
        key, block_s = self.keys.inbox(worker_id), max(block_s, 0.001)
        got = await self.redis.blpop([key], block_s)
        if not got or not got[1]:
            return []
        return [Handoff.decode(worker_id, got[1])]

    async def retire(self, worker_id: str, wake: bool = True) -> int:
        """Withdraw the worker's announcement; release the sessions handed to it but not taken.

        Called when a worker stops (`wake` pushes an empty entry so its blocked read returns) and
        when one starts (a previous process under the same id may have left sessions there).
        Returns the sessions released.
        """
        return await self.scripts.retire(worker_id, now_ms(), wake)

    async def complete(
        self, lease: Lease, job_id: str, state: JobState, *, result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None, take_next: bool = False, output: str = "",
        output_truncated: bool = False,
    ) -> JobRecord | None:
        """Fenced terminal transition; then the next job (running) when take_next, else release.

        `output` is what the job's `JobOutput` still held (`close()`), `output_truncated` whether
        it cut output; a result past `jobs.result_max_bytes` is cut here. Returns the next job,
        or None when the session was released. Raises LeaseLost.
        """
        field, value = ("res", result) if result is not None else ("err", error)
        encoded, result_cut = "", False
        if value is not None:
            encoded, result_cut = fit_result(value, compact_json(value), self.config.jobs.result_max_bytes)
        field = field if value is not None else ""
        cuts = (("output", output_truncated), ("result", result_cut))
        truncated = ",".join(name for name, cut in cuts if cut)
        folded = ""
        if result is not None and not result_cut:  # stored compactly (common/queue/compact.py)
            encoded = encode_result(result, encoded)
            folded = fold_output(output, result)
        return await self.scripts.complete(
            lease, job_id, str(state), field, encoded, now_ms(), take_next, output, truncated,
            folded if folded != output else "",
        )

    async def retry_later(
        self, lease: Lease, job_id: str, reason: str, attempts: int, delay_s: float | None = None
    ) -> tuple[str, int]:
        """Fenced: job stays at the head, session backs off and is released.

        `attempts` is the job's count before this failure (sets the exponential backoff).
        Returns ('retry', attempts) or ('dead', attempts) when it failed into the DLQ.
        """
        w = self.config.workers
        if delay_s is None:
            delay_s = min(w.retry_backoff_max_s, w.retry_backoff_base_s * 2**attempts)
            delay_s *= 1 + random.random() * 0.1  # jitter: spread retries of a shared outage
        problem = {"type": PROBLEM_RETRIES_EXHAUSTED, "title": "Infrastructure retries exhausted",
                   "status": 503, "detail": reason}
        delay_ms = int(delay_s * 1000)
        return await self.scripts.retry(lease, job_id, reason, now_ms(), delay_ms, w.max_attempts, problem)

    async def release(self, lease: Lease) -> bool:
        """Fenced release (re-notifies when work remains); False when the lease was already lost."""
        return await self.scripts.release(lease, now_ms())

    async def renew(self, leases: Sequence[tuple[Lease, str | None]]) -> list[int]:
        """Renew many leases at once: per lease 0 lost, 1 renewed, 2 renewed + cancel requested."""
        if not leases:
            return []
        return await self.scripts.renew(leases, now_ms())

    async def append_output(self, lease: Lease, job_id: str, stream: str, data: str) -> str:
        return await self.scripts.append_output(lease, job_id, stream, data)

    async def take_secrets(self, lease: Lease, job_id: str) -> dict[str, str] | None:
        return await self.scripts.take_secrets(lease, job_id)

    async def update_session(self, lease: Lease, fields: dict[str, str]) -> None:
        reserved = RESERVED_SESSION_FIELDS.intersection(fields)
        if reserved:
            raise ValueError(f"session fields {sorted(reserved)} belong to the queue")
        if fields:
            await self.scripts.update_session(lease, fields)

    async def peek_next_job(self, session: str) -> JobRecord | None:
        """The job after the head (the running one) of the session's FIFO, if any."""
        jid = await self.redis.lindex(self.keys.fifo(session), 1)
        return await self.get_job(text(jid)) if jid else None

    # -- reconciler repair primitives --------------------------------------------------------------
    async def repair_expired_leases(self, limit: int = 1000) -> int:
        """Sessions whose lease expired: new epoch, re-notified when work remains."""
        return await self.scripts.repair_leases(now_ms(), limit)

    async def notify_due_delayed(self, limit: int = 1000) -> int:
        """Sessions whose retry backoff is over: notified again."""
        return await self.scripts.notify_delayed(now_ms(), limit)

    async def notify_orphaned_work(self, page: int = 500) -> int:
        """Sessions with work, no owner, no backoff and no live notification: notified."""
        start, notified = 0, 0
        while True:
            n, seen = await self.scripts.notify_orphans(start, page, now_ms())
            notified += n
            if seen < page:
                return notified
            start += page

    async def forget_dead_workers(self) -> int:
        """Workers whose announcement lapsed (crashed, or stalled past it): forgotten."""
        return await self.scripts.forget_workers(now_ms())

    async def repair(self) -> dict[str, int]:
        """Every repair, in the order that lets one pass fix a crashed worker's session."""
        return {
            "expired_leases": await self.repair_expired_leases(),
            "due_delayed": await self.notify_due_delayed(),
            "dead_workers": await self.forget_dead_workers(),
            "orphaned_work": await self.notify_orphaned_work(),
        }


def _entries(raw: Sequence[Any]) -> list[OutputEntry]:
    return [(text(eid), {text(k): text(v) for k, v in fields.items()}) for eid, fields in raw]
