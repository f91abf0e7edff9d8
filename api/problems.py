"""RFC 9457 problem details: the API's one error hierarchy and its one renderer.

Every error the API answers is an `ApiProblem` rendered as `application/problem+json` with a
stable `type` URI (`https://atefleet.dev/problems/<slug>`, built by `common.problem_types`, which
lists every slug), so clients branch on `type`, never on `detail` text. Foreign errors (FastAPI's
validation errors, Starlette's HTTPException for unknown routes and methods, anything unexpected)
are translated once, here, into the same shape.

    ApiProblem(status, type_slug, title, detail, **extensions)
    ├── BadRequest                 400 bad_request
    ├── Unauthorized               401 unauthorized          (WWW-Authenticate: Bearer)
    ├── Forbidden                  403 forbidden
    │   ├── PolicyDenied           403 policy_denied         (rule, environment, tool)
    │   └── CallbackSecretForbidden 403 callback_secret_forbidden
    ├── QuotaExceeded              403/429 quota_exceeded    (quota, limit; Retry-After on 429)
    ├── NotFound                   404 not_found
    │   └── JobExpired             404 job_expired
    ├── MethodNotAllowed           405 method_not_allowed    (Allow)
    ├── Conflict                   409 conflict
    │   └── BackgroundProcessesRunning 409 background_processes_running
    ├── PayloadTooLarge            413 payload_too_large
    ├── Unprocessable              422 unprocessable         (errors: [{field, message}])
    │   ├── IdempotencyConflict    422 idempotency_conflict
    │   ├── InvalidToolCall        422 invalid_tool_call     (field)
    │   └── ToolNotAllowed         422 tool_not_allowed      (tool, environment)
    ├── RateLimited                429 rate_limited          (Retry-After)
    ├── InternalError              500 internal
    └── Unavailable                503 unavailable           (Retry-After when known)

`ToolNotAllowed` exists for surfaces that cannot answer in-band (batch validation); the seed
route answers a tool the environment does not allow in-band, exactly like the seed (200 with a
`function_call_output` whose output is an error message): see `api.tool_calls.render_tool_not_allowed`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from common.problem_types import PROBLEM_TYPES, TYPE_BASE, problem_type
from common.queue.models import RedisFull
from common.redis.errors import OutOfMemoryError as RedisOutOfMemoryError
from common.redis.errors import RedisConnectionError, RedisTimeoutError

#: Media type of every error answer (RFC 9457 section 3).
PROBLEM_MEDIA_TYPE = "application/problem+json"

#: Retry-After (seconds) while Redis is full: finished records expire over minutes, not at once.
FULL_RETRY_AFTER_S = 5

#: Members RFC 9457 defines; extensions must not shadow them.
_STANDARD_MEMBERS = frozenset({"type", "title", "status", "detail", "instance"})


class ApiProblem(Exception):
    """An error answer: HTTP status, stable type slug, title, detail and extension members."""

    def __init__(
        self,
        status: int,
        type_slug: str,
        title: str,
        detail: str = "",
        /,
        *,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        clash = _STANDARD_MEMBERS.intersection(extensions)
        if clash:
            raise ValueError(f"problem extensions may not redefine {sorted(clash)}")
        if type_slug not in PROBLEM_TYPES:
            raise ValueError(f"problem slug {type_slug!r} is not documented in common.problem_types")
        super().__init__(detail or title)
        self.status = status
        self.type_slug = type_slug
        self.title = title
        self.detail = detail
        self.headers: dict[str, str] = dict(headers or {})
        self.extensions: dict[str, Any] = extensions

    @property
    def type_uri(self) -> str:
        return problem_type(self.type_slug)

    def to_dict(self, instance: str | None = None) -> dict[str, Any]:
        """The problem+json body (also the shape stored as a failed job's `error`)."""
        body: dict[str, Any] = {"type": self.type_uri, "title": self.title, "status": self.status}
        if self.detail:
            body["detail"] = self.detail
        if instance:
            body["instance"] = instance
        body.update(self.extensions)
        return body

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ApiProblem:
        """Rebuild a problem from its body (e.g. a failed job's stored `error`)."""
        type_uri = str(body.get("type", ""))
        slug = type_uri.removeprefix(TYPE_BASE)
        if not type_uri.startswith(TYPE_BASE) or slug not in PROBLEM_TYPES:
            slug = "internal"
        extensions = {k: v for k, v in body.items() if k not in _STANDARD_MEMBERS}
        return ApiProblem(
            int(body.get("status", 500)),
            slug,
            str(body.get("title", "Error")),
            str(body.get("detail", "")),
            **extensions,
        )


class _FixedProblem(ApiProblem):
    """A problem whose status, slug and title are fixed by its class."""

    STATUS: ClassVar[int]
    SLUG: ClassVar[str]
    TITLE: ClassVar[str]

    def __init__(self, detail: str = "", /, *, headers: Mapping[str, str] | None = None, **extensions: Any):
        super().__init__(self.STATUS, self.SLUG, self.TITLE, detail, headers=headers, **extensions)


class BadRequest(_FixedProblem):
    STATUS, SLUG, TITLE = 400, "bad_request", "Bad request"


class Unauthorized(_FixedProblem):
    """Missing or invalid credentials; always carries the Bearer challenge (RFC 6750)."""

    STATUS, SLUG, TITLE = 401, "unauthorized", "Unauthorized"

    def __init__(self, detail: str = "", /, *, token_given: bool = False, **extensions: Any) -> None:
        # RFC 6750 section 3: name the error only when a token was presented.
        challenge = 'Bearer realm="atefleet"'
        if token_given:
            challenge += ', error="invalid_token"'
        super().__init__(detail, headers={"WWW-Authenticate": challenge}, **extensions)


class Forbidden(_FixedProblem):
    STATUS, SLUG, TITLE = 403, "forbidden", "Forbidden"


class PolicyDenied(Forbidden):
    """The environment's command policy refused the call; `rule` names the rule that matched
    (`environments.N.policy.rules.M`, or `environments.N.policy.default`)."""

    STATUS, SLUG, TITLE = 403, "policy_denied", "Refused by the environment's command policy"


class CallbackSecretForbidden(Forbidden):
    STATUS, SLUG, TITLE = 403, "callback_secret_forbidden", "Callback secret not usable by this principal"


class NotFound(_FixedProblem):
    STATUS, SLUG, TITLE = 404, "not_found", "Not found"


class JobExpired(NotFound):
    """The job existed but its record and result passed their TTL (`jobs.ttl_s`)."""

    STATUS, SLUG, TITLE = 404, "job_expired", "Job expired"


class MethodNotAllowed(_FixedProblem):
    STATUS, SLUG, TITLE = 405, "method_not_allowed", "Method not allowed"


class Conflict(_FixedProblem):
    STATUS, SLUG, TITLE = 409, "conflict", "Conflict"


class BackgroundProcessesRunning(Conflict):
    """Suspend refused: background processes would be killed. `processes` lists them."""

    STATUS, SLUG, TITLE = 409, "background_processes_running", "Background processes running"

    def __init__(self, detail: str = "", /, *, processes: Sequence[Mapping[str, Any]], **extensions: Any):
        super().__init__(detail, processes=[dict(p) for p in processes], **extensions)


class PayloadTooLarge(_FixedProblem):
    STATUS, SLUG, TITLE = 413, "payload_too_large", "Payload too large"


class Unprocessable(_FixedProblem):
    """Well-formed JSON that does not validate; `errors` lists `{field, message}` when known."""

    STATUS, SLUG, TITLE = 422, "unprocessable", "Unprocessable request"


class IdempotencyConflict(Unprocessable):
    """The Idempotency-Key was already used for a different request."""

    STATUS, SLUG, TITLE = 422, "idempotency_conflict", "Idempotency key reused with another request"


class InvalidToolCall(Unprocessable):
    """A malformed tool call; `field` names the offending member (dotted path)."""

    STATUS, SLUG, TITLE = 422, "invalid_tool_call", "Invalid tool call"

    def __init__(self, detail: str, /, *, field: str, **extensions: Any) -> None:
        super().__init__(detail, field=field, **extensions)


class ToolNotAllowed(Unprocessable):
    """The environment does not allow this tool (the seed route answers this in-band instead)."""

    STATUS, SLUG, TITLE = 422, "tool_not_allowed", "Tool not allowed in this environment"

    def __init__(self, tool: str, environment: str, /, **extensions: Any) -> None:
        detail = f"tool '{tool}' is not enabled in environment '{environment}'"
        super().__init__(detail, tool=tool, environment=environment, **extensions)


def _retry_after(seconds: float) -> dict[str, str]:
    # HTTP Retry-After takes whole seconds; round up so a client never retries too early.
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class RateLimited(_FixedProblem):
    STATUS, SLUG, TITLE = 429, "rate_limited", "Too many requests"

    def __init__(self, retry_after_s: float, detail: str = "", /, **extensions: Any) -> None:
        super().__init__(detail, headers=_retry_after(retry_after_s), **extensions)


class QuotaExceeded(ApiProblem):
    """A per-principal quota is used up: 429 with Retry-After when waiting frees it (work in
    flight ends), 403 when only the principal's own action does (e.g. destroying sessions)."""

    def __init__(self, quota: str, limit: int, detail: str, /, *, retry_after_s: float | None = None,
                 **extensions: Any) -> None:
        status, headers = (429, _retry_after(retry_after_s)) if retry_after_s is not None else (403, None)
        super().__init__(status, "quota_exceeded", "Quota exceeded", detail, headers=headers,
                         quota=quota, limit=limit, **extensions)


class InternalError(_FixedProblem):
    STATUS, SLUG, TITLE = 500, "internal", "Internal server error"


class Unavailable(_FixedProblem):
    STATUS, SLUG, TITLE = 503, "unavailable", "Service unavailable"

    def __init__(self, detail: str = "", /, *, retry_after_s: float | None = None, **extensions: Any) -> None:
        headers = _retry_after(retry_after_s) if retry_after_s is not None else None
        super().__init__(detail, headers=headers, **extensions)


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_MEDIA_TYPE


def problem_response(problem: ApiProblem, instance: str | None = None) -> Response:
    """The HTTP answer for a problem (usable outside FastAPI's handlers, e.g. in ASGI middleware)."""
    return ProblemResponse(problem.to_dict(instance), status_code=problem.status, headers=problem.headers)


def from_validation_error(exc: RequestValidationError) -> ApiProblem:
    """FastAPI's request validation error → 400 for undecodable JSON, else 422 listing each field."""
    errors = [
        {"field": ".".join(str(p) for p in e.get("loc", ())), "message": str(e.get("msg", ""))}
        for e in exc.errors()
    ]
    if exc.errors() and all(e.get("type") == "json_invalid" for e in exc.errors()):
        return BadRequest("the request body is not valid JSON", errors=errors)
    return Unprocessable("the request does not validate", errors=errors)


#: Status of a Starlette HTTPException → the problem class answering it.
_HTTP_STATUS_PROBLEMS: dict[int, type[_FixedProblem]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    422: Unprocessable,
    503: Unavailable,
}


def from_http_exception(exc: StarletteHTTPException) -> ApiProblem:
    """Starlette/FastAPI HTTPException (unknown route, wrong method, ...) → a problem, headers kept."""
    detail = exc.detail if isinstance(exc.detail, str) else ""
    problem_class = _HTTP_STATUS_PROBLEMS.get(exc.status_code)
    if problem_class is None:  # statuses Starlette raises rarely: the documented slug of their class
        slug = "bad_request" if exc.status_code < 500 else "internal"
        problem: ApiProblem = ApiProblem(exc.status_code, slug, detail or "HTTP error", detail)
    else:
        problem = problem_class(detail)
    problem.headers.update(exc.headers or {})
    return problem


def as_problem(exc: Exception) -> ApiProblem:
    """The problem answering an exception raised while handling a request (`InternalError` for
    anything unexpected: internals never leak to the client)."""
    if isinstance(exc, ApiProblem):
        return exc
    if isinstance(exc, RequestValidationError):
        return from_validation_error(exc)
    if isinstance(exc, StarletteHTTPException):
        return from_http_exception(exc)
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        # Redis restarting or unreachable: a retry soon will do (an Idempotency-Key makes it safe
        # when the request may have been enqueued before the connection dropped).
        return Unavailable("the job queue (Redis) is unreachable; retry shortly", retry_after_s=1)
    if isinstance(exc, RedisFull | RedisOutOfMemoryError):
        # Redis at maxmemory refused the write, so nothing was recorded; memory frees as jobs end
        # and finished records expire.
        return Unavailable("the job queue (Redis) is full; nothing was recorded; retry later",
                           retry_after_s=FULL_RETRY_AFTER_S)
    return InternalError()


async def _render(request: Request, exc: Exception) -> Response:
    """The one handler, for every exception class registered below. For unexpected ones Starlette
    re-raises after this answer, so the server logs the traceback once."""
    return problem_response(as_problem(exc), request.url.path)


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error of `app` with problem+json (ApiProblem, validation, HTTP, unexpected)."""
    for exc_class in (ApiProblem, RequestValidationError, StarletteHTTPException, RedisConnectionError,
                      RedisTimeoutError, RedisFull, RedisOutOfMemoryError, Exception):
        app.add_exception_handler(exc_class, _render)
