"""The SDK's one exception hierarchy: every failure a caller of `Client`/`AsyncClient` can see.

    AtefleetError
    ├── TransportError                 the API could not be reached or answered garbage
    │   ├── ConnectError               connect / reset (OSError underneath)
    │   ├── RequestTimeout             no complete answer within the timeout
    │   └── ProtocolError              not well-formed HTTP/1.1
    ├── JobNotFinished                 `wait` gave up before the job ended (`.job`)
    └── ProblemError                   the API answered problem+json (`.problem`, `.status`)
        ├── BadRequestError                 bad_request
        ├── UnauthorizedError               unauthorized
        ├── ForbiddenError                  forbidden
        │   ├── PolicyDeniedError           policy_denied
        │   ├── QuotaExceededError          quota_exceeded
        │   └── CallbackSecretForbiddenError callback_secret_forbidden
        ├── NotFoundError                   not_found
        │   └── JobExpiredError             job_expired
        ├── MethodNotAllowedError           method_not_allowed
        ├── ConflictError                   conflict
        │   ├── BackgroundProcessesRunningError background_processes_running
        │   ├── SessionNotRunningError      session_not_running
        │   ├── SessionDestroyedError       session_destroyed
        │   └── JobCancelledError           cancelled
        ├── PayloadTooLargeError            payload_too_large
        ├── UnprocessableError              unprocessable
        │   ├── IdempotencyConflictError    idempotency_conflict
        │   ├── InvalidToolCallError        invalid_tool_call
        │   └── ToolNotAllowedError         tool_not_allowed
        ├── RateLimitedError                rate_limited
        ├── InternalError                   internal, invalid_result, secrets_unreadable/missing
        ├── GuestError                      guest_error
        ├── UnavailableError                unavailable, substrate_configuration, retries_exhausted
        │   └── NoCapacityError             no_capacity
        └── SnapshotRefusedError            snapshot_refused
            └── WorkspaceOverQuotaError     workspace_over_quota

A problem's class is found by the last segment of its `type` (so `.../problems/job_expired`, a
`job-expired` spelling and a `urn:...:job_expired` all map); an unknown type falls back to the
class of its HTTP status.
"""

from __future__ import annotations

from typing import Any, ClassVar

from atefleet.client._wire import ProtocolError as _WireProtocolError
from atefleet.client.models import Problem


class AtefleetError(Exception):
    """Base of every error the SDK raises."""


class TransportError(AtefleetError):
    pass


class ConnectError(TransportError):
    pass


class RequestTimeout(TransportError):
    pass


class ProtocolError(TransportError):
    pass


class JobNotFinished(AtefleetError):
    """`wait(timeout_s=...)` ran out before the job ended; `job` is the job as last seen."""

    def __init__(self, job: Any) -> None:
        super().__init__(f"job {job.id} is still {job.state}")
        self.job = job


class ProblemError(AtefleetError):
    """An RFC 9457 problem answered by the API (or stored as a failed job's `error`)."""

    #: The problem slugs this class answers (subclasses narrow them).
    SLUGS: ClassVar[tuple[str, ...]] = ()
    STATUS: ClassVar[int | None] = None

    def __init__(self, problem: Problem) -> None:
        detail = f": {problem.detail}" if problem.detail else ""
        super().__init__(f"{problem.status} {problem.title}{detail}")
        self.problem = problem

    @property
    def status(self) -> int:
        return self.problem.status

    @property
    def slug(self) -> str:
        return self.problem.slug


class BadRequestError(ProblemError):
    SLUGS, STATUS = ("bad_request",), 400


class UnauthorizedError(ProblemError):
    SLUGS, STATUS = ("unauthorized",), 401


class ForbiddenError(ProblemError):
    SLUGS, STATUS = ("forbidden",), 403


class PolicyDeniedError(ForbiddenError):
    SLUGS = ("policy_denied",)


class QuotaExceededError(ForbiddenError):
    SLUGS = ("quota_exceeded",)


class CallbackSecretForbiddenError(ForbiddenError):
    SLUGS = ("callback_secret_forbidden",)


class NotFoundError(ProblemError):
    SLUGS, STATUS = ("not_found",), 404


class JobExpiredError(NotFoundError):
    SLUGS = ("job_expired",)


class MethodNotAllowedError(ProblemError):
    SLUGS, STATUS = ("method_not_allowed",), 405


class ConflictError(ProblemError):
    SLUGS, STATUS = ("conflict",), 409


class BackgroundProcessesRunningError(ConflictError):
    SLUGS = ("background_processes_running",)


class SessionNotRunningError(ConflictError):
    SLUGS = ("session_not_running",)


class SessionDestroyedError(ConflictError):
    SLUGS = ("session_destroyed",)


class JobCancelledError(ConflictError):
    SLUGS = ("cancelled",)


class PayloadTooLargeError(ProblemError):
    SLUGS, STATUS = ("payload_too_large",), 413


class UnprocessableError(ProblemError):
    SLUGS, STATUS = ("unprocessable",), 422


class IdempotencyConflictError(UnprocessableError):
    SLUGS = ("idempotency_conflict",)


class InvalidToolCallError(UnprocessableError):
    SLUGS = ("invalid_tool_call",)


class ToolNotAllowedError(UnprocessableError):
    SLUGS = ("tool_not_allowed",)


class RateLimitedError(ProblemError):
    SLUGS, STATUS = ("rate_limited",), 429


class InternalError(ProblemError):
    SLUGS, STATUS = ("internal", "invalid_result", "secrets_unreadable", "secrets_missing"), 500


class GuestError(ProblemError):
    SLUGS, STATUS = ("guest_error",), 502


class UnavailableError(ProblemError):
    SLUGS: ClassVar[tuple[str, ...]] = ("unavailable", "substrate_configuration", "retries_exhausted")
    STATUS = 503


class NoCapacityError(UnavailableError):
    SLUGS = ("no_capacity",)


class SnapshotRefusedError(ProblemError):
    SLUGS, STATUS = ("snapshot_refused",), 507


# A subclass, so the 507 fallback for an unknown slug stays SnapshotRefusedError: both say the
# session's files are over its template's snapshot limits (this one: stopped by the disk guard).
class WorkspaceOverQuotaError(SnapshotRefusedError):
    SLUGS = ("workspace_over_quota",)


def _all_subclasses(cls: type[ProblemError]) -> list[type[ProblemError]]:
    out: list[type[ProblemError]] = []
    for sub in cls.__subclasses__():
        out += [sub, *_all_subclasses(sub)]
    return out


#: Problem slug → its class (every slug the API documents).
PROBLEM_CLASSES: dict[str, type[ProblemError]] = {
    slug: cls for cls in _all_subclasses(ProblemError) for slug in cls.SLUGS}

#: HTTP status → the class of an undocumented slug with that status.
_BY_STATUS: dict[int, type[ProblemError]] = {
    cls.STATUS: cls for cls in ProblemError.__subclasses__() if cls.STATUS is not None}


def problem_error(problem: Problem) -> ProblemError:
    """The exception for a problem document."""
    cls = PROBLEM_CLASSES.get(problem.slug) or _BY_STATUS.get(problem.status, ProblemError)
    return cls(problem)


#: What the transports raise for a failed exchange (translated once, by `transport_error`).
TRANSPORT_FAILURES: tuple[type[BaseException], ...] = (OSError, TimeoutError, _WireProtocolError)


def transport_error(err: BaseException) -> TransportError:
    """A builtin transport failure as the SDK's error (the caller chains the cause)."""
    if isinstance(err, TimeoutError):
        return RequestTimeout("no complete answer from the API within the timeout")
    if isinstance(err, _WireProtocolError):
        return ProtocolError(str(err))
    return ConnectError(f"cannot reach the API: {err}")
