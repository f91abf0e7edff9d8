"""The problem+json vocabulary: every `type` a client can branch on, and the one builder of them.

Every error the fleet answers (the API's own refusals, and a failed job's stored `error`, written
by workers and the queue) carries a `type` made here: `https://atefleet.dev/problems/<slug>`.
`PROBLEM_TYPES` lists every slug with what it means; README's table is this table, and a test
walks the API's error answers checking each `type` is one of these.
"""

from __future__ import annotations

from typing import Any

#: Base of every problem `type` URI; the slug after it is the stable, documented part.
TYPE_BASE = "https://atefleet.dev/problems/"

#: Every problem slug → what it means. A slug not listed here is never answered.
PROBLEM_TYPES: dict[str, str] = {
    "bad_request": "400: the request is malformed (e.g. its body is not JSON)",
    "unauthorized": "401: no valid bearer token",
    "forbidden": "403: the principal may not use this environment or session, or lacks the admin scope",
    "policy_denied": "403: the environment's command policy refused the call (`rule` names the rule)",
    "quota_exceeded": (
        "403/429: a per-principal quota is used up (`quota`, `limit`; Retry-After when waiting helps)"),
    "callback_secret_forbidden": "403: the callback_secret_id is not one this principal may use",
    "not_found": "404: no such environment, session or job (or it belongs to another principal)",
    "job_expired": "404: the job ended more than `jobs.ttl_s` ago and was forgotten",
    "method_not_allowed": "405: the route does not take this method",
    "conflict": "409: the request conflicts with the current state",
    "background_processes_running": "409: suspend refused, background processes would be killed",
    "session_not_running": "409: the call needs a running session (resume it, or send auto_resume)",
    "session_destroyed": "409: the session was destroyed keeping its snapshot",
    "cancelled": "409: the job was cancelled",
    "payload_too_large": "413: the body exceeds `api.body_max_bytes`",
    "unprocessable": "422: valid JSON that does not validate (`errors` lists fields)",
    "idempotency_conflict": "422: the Idempotency-Key was used with a different request",
    "invalid_tool_call": "422: a malformed tool call (`field` names the member)",
    "tool_not_allowed": "422: the environment does not enable this tool (batch route)",
    "rate_limited": "429: the principal's request rate is exceeded (Retry-After)",
    "internal": "500: an unexpected error inside the fleet",
    "invalid_result": "500: the job's handler returned a result that could not be stored",
    "secrets_unreadable": "500: the call's sealed env variables could not be opened",
    "secrets_missing": "500: the call's sealed env variables are gone (expired): it was not run",
    "guest_error": "502: the sandbox's guest answered with an error",
    "unavailable": "503: a dependency (Redis, Substrate) is unreachable; retry (Retry-After)",
    "substrate_configuration": "503: Substrate refused the environment's configuration",
    "no_capacity": ("503: no Substrate worker became free within `workers.capacity_wait_s` and no running "
                    "session could be parked (`position`: the place it had in the wait queue)"),
    "retries_exhausted": "503: infrastructure failures used up the job's attempts (the job went to the DLQ)",
    "snapshot_refused": ("507: the session's files are over its template's limits (bytes, entries, depth): "
                         "nothing was saved, the session is suspended at its last snapshot"),
    "workspace_over_quota": (
        "507: while the host's disk was low, the session's files were over its template's limits: it was "
        "stopped and is back at its last snapshot (answered once, by the first call after; the next resume "
        "restores that snapshot)"),
}


def problem_type(slug: str) -> str:
    """The `type` URI of a documented slug; an undocumented one is a programming error."""
    if slug not in PROBLEM_TYPES:
        raise KeyError(f"problem slug {slug!r} is not in common.problem_types.PROBLEM_TYPES")
    return TYPE_BASE + slug


def problem_body(status: int, slug: str, title: str, detail: str = "", **extensions: Any) -> dict[str, Any]:
    """A problem+json body (as a failed job stores it in `error`)."""
    body: dict[str, Any] = {"type": problem_type(slug), "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extensions)
    return body
