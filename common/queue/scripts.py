"""The queue's Lua scripts and one typed method each.

Each script in `lua/` declares its keys (see common/redis/scripts.py, which builds and sends it);
the limits below and from config (`ScriptLimits`) and `_lib.lua` come before its body. Callers
use the methods of `QueueScripts`; nothing else calls EVALSHA. Every worker-side mutation is
fenced: the script compares the lease value (`<worker>:<epoch>`) first and writes nothing when it
differs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from common.config import QuotaLimits
from common.queue.compact import compact_json
from common.queue.keys import Keys, session_name
from common.queue.models import (
    OOM_REPLY,
    IdempotencyConflict,
    JobKind,
    JobRecord,
    LeaseLost,
    NewJob,
    QuotaRefused,
    RedisFull,
    SessionNotOwned,
)
from common.redis.errors import OutOfMemoryError, ResponseError
from common.redis.link import RedisArg
from common.redis.scripts import ScriptRunner, Send, load_script

#: Default entries kept in the `events` stream (approximate trim): its readers (webhook deliverer,
#: metrics) must keep up within this many state changes (~3 per job).
EVENTS_MAXLEN = 1_000_000
#: Entries kept in the `dlq` stream (approximate trim).
DLQ_MAXLEN = 10_000
#: Largest result/error (bytes of JSON) published inline on the done channel. Every API process
#: receives every note, so big answers are left in the record for the one waiter to read.
DONE_INLINE_MAX = 16_384

SCRIPT_NAMES = (
    "enqueue", "take_work", "retire", "complete", "retry", "release", "renew", "append_output",
    "take_secrets", "update_session", "cancel", "record_webhook", "repair_leases", "notify_delayed",
    "notify_orphans", "forget_workers", "forget_session", "replay_dlq",
)


@dataclass(frozen=True)
class ScriptLimits:
    """Config values compiled into the scripts (milliseconds, entry counts, bytes)."""

    ttl_ms: int  # terminal job records
    end_ttl_ms: int  # an output stream written only to wake a reader blocked on it
    output_ttl_ms: int  # a finished job's output stream
    fold_max_bytes: int  # output folded into the record at most
    output_maxlen: int
    lease_ttl_ms: int
    idempotency_ttl_ms: int
    events_maxlen: int = EVENTS_MAXLEN

    def lua(self) -> str:
        return (
            f"local EVENTS_MAXLEN = {self.events_maxlen}\nlocal DLQ_MAXLEN = {DLQ_MAXLEN}\n"
            f"local TTL_MS = {self.ttl_ms}\nlocal END_TTL_MS = {self.end_ttl_ms}\n"
            f"local OUT_TTL_MS = {self.output_ttl_ms}\nlocal FOLD_MAX = {self.fold_max_bytes}\n"
            f"local OUT_MAXLEN = {self.output_maxlen}\nlocal LEASE_TTL_MS = {self.lease_ttl_ms}\n"
            f"local IDEM_TTL_MS = {self.idempotency_ttl_ms}\nlocal DONE_INLINE_MAX = {DONE_INLINE_MAX}\n"
        )


@dataclass(frozen=True)
class Lease:
    """A worker's ownership of one session; `value` is what the lease key holds."""

    session: str
    worker_id: str
    epoch: int

    @property
    def value(self) -> str:
        return f"{self.worker_id}:{self.epoch}"


@dataclass(frozen=True)
class Handoff:
    """A session handed to a worker: its lease (new epoch) and its head job, now running."""

    lease: Lease
    job: JobRecord

    @classmethod
    def decode(cls, worker_id: str, raw: str | bytes) -> Handoff:
        """From the JSON array notify/take_work build: session, epoch, jid, field, value, ..."""
        flat = json.loads(raw)
        return cls(Lease(flat[0], worker_id, int(flat[1])), _head_job(flat[2:]))


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _head_job(flat: Sequence[Any]) -> JobRecord:
    """`{jid, field, value, ...}` as returned by take_head in _lib.lua."""
    it = iter(flat[1:])
    return JobRecord.from_fields(_str(flat[0]), {_str(k): _str(v) for k, v in zip(it, it, strict=True)})


#: No quota at all: what fleet-internal enqueues pass.
_NO_QUOTAS = QuotaLimits()


def audit_op(job: NewJob) -> str:
    """What a job's audit record names: the tool of a tool call, else the lifecycle operation."""
    return str(job.payload.get("name", "")) if job.kind == JobKind.TOOL else str(job.kind)


def _lost(lease: Lease, what: str) -> LeaseLost:
    return LeaseLost(f"lease {lease.value} of {lease.session} lost; {what}")


class QueueScripts:
    """Typed calls of the queue's scripts, sent by `send` (the process's pipelined link)."""

    def __init__(self, send: Send, keys: Keys, limits: ScriptLimits) -> None:
        lib = resources.files("common.queue").joinpath("lua", "_lib.lua").read_text()
        prelude = limits.lua() + lib
        self._s = {name: load_script("common.queue", name, keys, prelude) for name in SCRIPT_NAMES}
        self._runner = ScriptRunner(send)

    async def load(self) -> None:
        """Load every script now (else each is loaded on its first NOSCRIPT)."""
        await self._runner.load(self._s.values())

    async def _run(self, name: str, args: Sequence[RedisArg], of: Sequence[Any] = (),
                   each: Sequence[Sequence[Any]] = ()) -> Any:
        """The script's reply. Raises RedisFull when Redis, at maxmemory, refused the script's
        first write (a script that wrote once is let finish, so nothing is half-written)."""
        try:
            return await self._runner.call(self._s[name], of, each, args)
        except ResponseError as err:
            # OutOfMemoryError: the link's reply on 6.2 and 7 (7's text lacks the code); text: redis-py on 6.2
            if isinstance(err, OutOfMemoryError) or OOM_REPLY in str(err):
                raise RedisFull(str(err)) from err
            raise

    async def enqueue(
        self, jobs: Sequence[tuple[str, NewJob, str | None, str]], now_ms: int,
        quotas: QuotaLimits | None = None, audit_maxlen: int = 0,
    ) -> list[tuple[str, bool]]:
        """jobs = (job id, job, idempotency key or None, fingerprint); [(job id, created)].

        Raises IdempotencyConflict, SessionNotOwned, QuotaRefused (then nothing was written)."""
        q = quotas or _NO_QUOTAS
        args: list[RedisArg] = [now_ms, len(jobs), q.sessions_owned, q.jobs_queued_per_session,
                                q.jobs_queued, q.output_bytes, audit_maxlen]
        for jid, job, idem, fingerprint in jobs:
            args += [
                jid, job.session, job.environment, job.session_id, str(job.kind),
                compact_json(job.payload), job.principal, job.callback_url or "",
                job.callback_secret_id or "", idem or "", fingerprint, str(job.tenancy), audit_op(job),
            ]
        args += [compact_json(job.secrets) if job.secrets else "" for _, job, _, _ in jobs]
        each = [(jid, job.session, job.environment, job.principal, (job.principal, idem or ""))
                for jid, job, idem, _ in jobs]
        raw = await self._run("enqueue", args, each=each)
        status = _str(raw[0])
        if status != "ok":
            index = int(raw[1]) - 1
            if status == "conflict":
                raise IdempotencyConflict(jobs[index][2] or "", _str(raw[2]))
            if status == "denied":
                raise SessionNotOwned(index, jobs[index][1].session)
            retry_ms = int(raw[3])
            raise QuotaRefused(index, _str(raw[2]), retry_ms / 1000 if retry_ms else None)
        return [(_str(raw[i]), int(raw[i + 1]) == 1) for i in range(1, len(raw), 2)]

    async def take_work(
        self, worker_id: str, slots: int, now_ms: int, announce_ms: int, free: int
    ) -> list[Handoff]:
        raw = await self._run("take_work", [worker_id, slots, now_ms, announce_ms, free])
        return [Handoff.decode(worker_id, h) for h in raw]

    async def retire(self, worker_id: str, now_ms: int, wake: bool) -> int:
        return int(await self._run("retire", [worker_id, now_ms, int(wake)], (worker_id,)))

    async def complete(
        self, lease: Lease, job_id: str, state: str, field: str, value: str, now_ms: int, take_next: bool,
        output: str = "", truncated: str = "", folded: str = "",
    ) -> JobRecord | None:
        """Finish the running job; the next job (now running) or None when released. `folded`:
        what the record keeps of `output` if it is folded ('' for the output itself)."""
        raw = await self._run(
            "complete",
            [lease.value, lease.session, lease.epoch, job_id, state, field, value, now_ms, int(take_next),
             output, truncated, folded],
            (lease.session, job_id),
        )
        status = _str(raw[0])
        if status == "lost":
            raise _lost(lease, f"job {job_id} not completed")
        return _head_job(raw[1:]) if status == "next" else None

    async def retry(
        self, lease: Lease, job_id: str, reason: str, now_ms: int, delay_ms: int, max_attempts: int,
        problem: dict[str, Any],
    ) -> tuple[str, int]:
        """('retry' | 'dead', attempts so far)."""
        raw = await self._run(
            "retry",
            [lease.value, lease.session, job_id, reason, now_ms, delay_ms, max_attempts, json.dumps(problem)],
            (lease.session, job_id),
        )
        status = _str(raw[0])
        if status == "lost":
            raise _lost(lease, f"job {job_id} not retried")
        return status, int(raw[1])

    async def release(self, lease: Lease, now_ms: int) -> bool:
        return int(await self._run("release", [lease.value, lease.session, now_ms], (lease.session,))) == 1

    async def renew(self, leases: Sequence[tuple[Lease, str | None]], now_ms: int) -> list[int]:
        """(lease, running job id) pairs → 0 lost, 1 renewed, 2 renewed + cancel requested."""
        args: list[RedisArg] = [now_ms]
        for lease, jid in leases:
            args += [lease.session, lease.value, jid or ""]
        each = [(lease.session, jid or "") for lease, jid in leases]
        return [int(x) for x in await self._run("renew", args, each=each)]

    async def append_output(self, lease: Lease, job_id: str, stream: str, data: str) -> str:
        raw = await self._run("append_output", [lease.value, stream, data], (lease.session, job_id))
        if raw is None:
            raise _lost(lease, f"output of {job_id} dropped")
        return _str(raw)

    async def take_secrets(self, lease: Lease, job_id: str) -> dict[str, str] | None:
        raw = await self._run("take_secrets", [lease.value], (lease.session, job_id))
        if _str(raw[0]) == "lost":
            raise _lost(lease, f"secrets of {job_id} kept")
        value = _str(raw[1])
        if not value:
            return None
        secrets: dict[str, str] = json.loads(value)
        return secrets

    async def update_session(self, lease: Lease, fields: dict[str, str]) -> None:
        args: list[RedisArg] = [lease.value]
        for name, value in fields.items():
            args += [name, value]
        if int(await self._run("update_session", args, (lease.session,))) != 1:
            raise _lost(lease, "session not updated")

    async def cancel(self, job_id: str, now_ms: int, problem: dict[str, Any]) -> str:
        """'missing' | 'cancelled' | 'requested' | 'terminal'."""
        return _str(await self._run("cancel", [job_id, now_ms, json.dumps(problem)], (job_id,)))

    async def record_webhook(self, job_id: str, attempt: dict[str, Any]) -> int:
        return int(await self._run("record_webhook", [json.dumps(attempt)], (job_id,)))

    async def repair_leases(self, now_ms: int, limit: int) -> int:
        return int(await self._run("repair_leases", [now_ms, limit]))

    async def notify_delayed(self, now_ms: int, limit: int) -> int:
        return int(await self._run("notify_delayed", [now_ms, limit]))

    async def notify_orphans(self, start: int, limit: int, now_ms: int) -> tuple[int, int]:
        """(sessions notified, members looked at) for `work` members [start, start+limit)."""
        raw = await self._run("notify_orphans", [start, limit, now_ms])
        return int(raw[0]), int(raw[1])

    async def forget_workers(self, now_ms: int) -> int:
        return int(await self._run("forget_workers", [now_ms]))

    async def forget_session(self, environment: str, session_id: str) -> bool:
        session = session_name(environment, session_id)
        return int(await self._run("forget_session", [session, session_id], (session, environment))) == 1

    async def replay_dlq(self, entry_id: str, now_ms: int) -> tuple[str, str | None, str | None]:
        """(outcome, job id, its state): 'queued' | 'missing' | 'expired' | 'not_failed'."""
        raw = [_str(x) for x in await self._run("replay_dlq", [entry_id, now_ms])]
        return raw[0], (raw[1] if len(raw) > 1 else None), (raw[2] if len(raw) > 2 else None)
