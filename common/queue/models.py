"""The queue's data types: job states and kinds, new jobs, job records, and the errors.

Exceptions (one hierarchy for the queue boundary):

    QueueError
     ├── IdempotencyConflict   same idempotency key, different request fingerprint
     ├── SessionNotOwned       the session belongs to another principal (Tenancy.OWN)
     ├── QuotaRefused          the job would exceed one of its principal's quotas
     ├── LeaseLost             a fenced write was refused: the caller no longer owns the session
     └── RedisFull             Redis refused a write (maxmemory reached): nothing was written

Handler outcomes (raised by a Consumer handler, not errors of the queue itself):

    HandlerOutcome
     ├── RetryLater(reason, delay_s)   infrastructure failure: keep the job at the head, back off
     ├── JobFailed(problem)            permanent failure: the job fails with this problem+json
     └── JobCancelled(detail)          the handler stopped the execution because of ctx.cancelled
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common.problem_types import problem_type
from common.queue.compact import decode_result
from common.queue.keys import split_session
from common.redis.errors import OutOfMemoryError, RedisConnectionError, RedisTimeoutError


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: States a job never leaves.
TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class JobKind(StrEnum):
    RESUME = "resume"
    SUSPEND = "suspend"
    DESTROY = "destroy"
    SUSPEND_IF_IDLE = "suspend_if_idle"
    TOOL = "tool"


#: problem+json `type` of the queue's own failures (one scheme for every problem: common.problem_types).
PROBLEM_RETRIES_EXHAUSTED = problem_type("retries_exhausted")
PROBLEM_CANCELLED = problem_type("cancelled")
PROBLEM_INVALID_RESULT = problem_type("invalid_result")


class QueueError(Exception):
    """Base of the queue's errors."""


class IdempotencyConflict(QueueError):
    """The idempotency key was used before with a different request."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(f"idempotency key {key!r} was used for a different request (job {job_id})")
        self.key = key
        self.job_id = job_id


class SessionNotOwned(QueueError):
    """Job `index` of an enqueue is for a session another principal owns (nothing was written)."""

    def __init__(self, index: int, session: str) -> None:
        super().__init__(f"session {session} belongs to another principal")
        self.index = index
        self.session = session


class QuotaRefused(QueueError):
    """Job `index` would exceed quota `quota` (nothing was written); `retry_after_s` is None when
    only the principal's own action (destroying sessions) frees it."""

    def __init__(self, index: int, quota: str, retry_after_s: float | None) -> None:
        super().__init__(f"quota {quota} exceeded")
        self.index = index
        self.quota = quota
        self.retry_after_s = retry_after_s


class LeaseLost(QueueError):
    """A fenced script found another lease value (or none): this worker no longer owns the session."""


class RedisFull(QueueError):
    """Redis is at `maxmemory` and refused a script's first write, so the script wrote nothing
    (Redis lets a script that has written once finish its writes). Retry later: memory frees as
    jobs end and records expire."""


#: How Redis words the refusal, inside a script's error reply or as a command's own `-OOM` reply.
OOM_REPLY = "OOM command not allowed"

#: Errors that mean "Redis cannot serve this right now" (unreachable, or full): retried with backoff.
TRANSIENT = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError, RedisFull, OutOfMemoryError)


class HandlerOutcome(Exception):
    """Base of what a handler raises to end a job other than by returning its result."""


class RetryLater(HandlerOutcome):
    """Infrastructure failure: retry the job in place after a backoff (delay_s, or exponential)."""

    def __init__(self, reason: str, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


class JobFailed(HandlerOutcome):
    """Permanent failure with a problem+json body (type, title, status, detail, ...)."""

    def __init__(self, problem: dict[str, Any]) -> None:
        super().__init__(problem.get("detail") or problem.get("title") or "job failed")
        self.problem = problem


class JobCancelled(HandlerOutcome):
    """The handler honoured a cancel request; the job ends as cancelled."""

    def __init__(self, detail: str = "cancelled on request") -> None:
        super().__init__(detail)
        self.detail = detail


class Tenancy(StrEnum):
    """What enqueue checks and records for a job (see enqueue.lua)."""

    #: A fleet-internal job (the reconciler's): no owner check, no owner, no quota, no audit.
    INTERNAL = ""
    #: The session must be the principal's or nobody's (then it becomes the principal's).
    OWN = "own"
    #: An admin: any session (a new one still gets its first owner); acting in another
    #: principal's session is audited as `admin`.
    ADMIN = "admin"
    #: A shared environment: any session (a new one still gets its first owner).
    SHARED = "shared"


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue. `secrets` are stored apart and never appear in the record or events."""

    environment: str
    session_id: str
    kind: JobKind
    payload: dict[str, Any]
    principal: str
    callback_url: str | None = None
    callback_secret_id: str | None = None
    secrets: dict[str, str] | None = None
    tenancy: Tenancy = Tenancy.INTERNAL

    @property
    def session(self) -> str:
        return f"{self.environment}/{self.session_id}"


@dataclass(frozen=True)
class EnqueueResult:
    job_id: str
    #: False when an idempotency key matched an earlier job with the same fingerprint.
    created: bool
    #: The record as written (state queued) when created; None for a replay (read it if needed).
    record: JobRecord | None = None


@dataclass
class JobRecord:
    id: str
    environment: str
    session_id: str
    kind: JobKind
    state: JobState
    payload: dict[str, Any]
    principal: str
    callback_url: str | None
    callback_secret_id: str | None
    attempts: int
    epoch: int
    created_at: float | None
    started_at: float | None
    finished_at: float | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    cancel_requested: bool
    webhook_attempts: list[dict[str, Any]] = field(default_factory=list)
    #: What was cut to fit its caps: "output" (`jobs.output_max_bytes`), "result" (`result_max_bytes`).
    truncated: tuple[str, ...] = ()

    @property
    def session(self) -> str:
        return f"{self.environment}/{self.session_id}"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def queued(cls, job_id: str, job: NewJob, created_ms: int) -> JobRecord:
        """The record enqueue.lua writes for `job`, without reading it back."""
        return cls(
            id=job_id,
            environment=job.environment,
            session_id=job.session_id,
            kind=job.kind,
            state=JobState.QUEUED,
            payload=job.payload,
            principal=job.principal,
            callback_url=job.callback_url,
            callback_secret_id=job.callback_secret_id,
            attempts=0,
            epoch=0,
            created_at=created_ms / 1000,
            started_at=None,
            finished_at=None,
            result=None,
            error=None,
            cancel_requested=False,
        )

    @classmethod
    def from_fields(cls, job_id: str, raw: Mapping[Any, Any]) -> JobRecord:
        """Build from the job hash (short field names, see enqueue.lua); bytes or str accepted."""
        f = {text(k): text(v) for k, v in raw.items()}
        env, sid = split_session(f["s"])
        return cls(
            id=job_id,
            environment=env,
            session_id=sid,
            kind=JobKind(f["k"]),
            state=JobState(f["st"]),
            payload=json.loads(f.get("pl") or "{}"),
            principal=f.get("pr", ""),
            callback_url=f.get("cb") or None,
            callback_secret_id=f.get("cbs") or None,
            attempts=int(f.get("at") or 0),
            epoch=int(f.get("ep") or 0),
            created_at=_ms_to_s(f.get("ct")),
            started_at=_ms_to_s(f.get("sa")),
            finished_at=_ms_to_s(f.get("fa")),
            result=decode_result(f.get("res")),
            error=_json_or_none(f.get("err")),
            cancel_requested=f.get("cx") == "1",
            webhook_attempts=json.loads(f.get("wh") or "[]"),
            truncated=tuple(f["tr"].split(",")) if f.get("tr") else (),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (the API's job representation builds on it)."""
        return {
            "id": self.id,
            "environment": self.environment,
            "session_id": self.session_id,
            "kind": str(self.kind),
            "state": str(self.state),
            "payload": self.payload,
            "principal": self.principal,
            "callback_url": self.callback_url,
            "callback_secret_id": self.callback_secret_id,
            "attempts": self.attempts,
            "epoch": self.epoch,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
            "cancel_requested": self.cancel_requested,
            "webhook_attempts": self.webhook_attempts,
            "truncated": list(self.truncated),
        }


def text(value: Any) -> str:
    """Redis replies as str whether the client decodes responses or not."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _ms_to_s(value: str | None) -> float | None:
    return int(value) / 1000.0 if value else None


def _json_or_none(value: str | None) -> dict[str, Any] | None:
    if not value:
        return None
    loaded: dict[str, Any] = json.loads(value)
    return loaded
