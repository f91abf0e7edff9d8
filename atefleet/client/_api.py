"""The API's operations without I/O: each one a `Request` and a decoder of its answer (each
endpoint's path, body and result model are written here once), plus the retry policy. The
multi-request logic on top (retries, long-polls, paging, streams) is `_plans`'."""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from atefleet.client._wire import Request, Response
from atefleet.client.errors import problem_error
from atefleet.client.models import Environment, Job, Problem, SessionInfo, ToolResult

T = TypeVar("T")

#: Longest long-poll the SDK asks for in one request (the API caps it at `jobs.long_poll_max_s`).
LONG_POLL_S = 30.0

#: Answers retried with backoff: the API is overloaded or a dependency is down for a moment.
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Settings:
    """How a client talks to the API."""

    base_url: str = "http://127.0.0.1:7777"
    token: str | None = None
    #: Whole-answer timeout of one request (a sync tool call waits up to the API's `jobs.sync_wait_s`).
    timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    #: Retries of one logical call (on 429/503 and lost connections), with the same Idempotency-Key.
    max_retries: int = 4
    backoff_base_s: float = 0.2
    backoff_max_s: float = 10.0

    def headers(self) -> dict[str, str]:
        host = self.base_url.split("//", 1)[-1].split("/", 1)[0]
        headers = {"host": host, "user-agent": "atefleet-client/0.1"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return headers


@dataclass(slots=True)
class Op(Generic[T]):
    """One API operation: the request, and what a 2xx answer's JSON becomes."""

    request: Request
    decode: Callable[[Any], T]
    #: A POST that changes nothing (a multi-job wait), so it may be sent again like a GET.
    safe: bool = False

    @property
    def retryable_on_lost_connection(self) -> bool:
        """GETs, safe POSTs, and POSTs carrying an Idempotency-Key may be sent again after a lost answer."""
        return self.safe or self.request.method == "GET" or "idempotency-key" in self.request.headers


def retry_delay_s(settings: Settings, attempt: int, response: Response | None) -> float | None:
    """Seconds to wait before retry number `attempt` (1-based), or None when not to retry.

    `response` is None after a lost connection or timeout. Retry-After (seconds), when the API
    gives it, wins over the backoff (full jitter, doubling from `backoff_base_s`)."""
    if attempt > settings.max_retries or (response is not None and response.status not in RETRY_STATUSES):
        return None
    if response is not None:
        retry_after = response.headers.get("retry-after", "")
        if retry_after.isdigit():
            return float(retry_after)
    return random.uniform(0, min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (attempt - 1)))


def decode(op: Op[T], response: Response) -> T:
    """The operation's value from a 2xx answer; a problem (or any error status) raised as its class."""
    if response.status >= 400:
        raise_problem(response)
    return op.decode(response.json())


def raise_problem(response: Response) -> None:
    """Raise the problem an error answer carries, as its class."""
    raise problem_error(_problem(response))


def _problem(response: Response) -> Problem:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return Problem.model_validate({"status": response.status, **body})
    return Problem(status=response.status, title=f"HTTP {response.status}",
                   detail=response.body[:500].decode(errors="replace"))


# ---------------------------------------------------------------------------------------------
# Requests


def _key() -> str:
    """A fresh Idempotency-Key (128 random bits)."""
    return os.urandom(16).hex()


#: One encoder for every body (`json.dumps` with options builds a new one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _json(body: Any) -> bytes:
    return _ENCODER.encode(body).encode()


@functools.lru_cache(maxsize=4096)
def session_path(env: str, sid: str) -> str:
    return f"/v1/environments/{quote(env, safe='')}/sessions/{quote(sid, safe='')}"


def tool_item(name: str, arguments: Mapping[str, Any], call_id: str = "") -> dict[str, Any]:
    """A seed-shaped tool call (the API's native body; `arguments` as an object, which the API
    takes like the JSON string OpenAI sends)."""
    return {"call_id": call_id or f"call_{os.urandom(6).hex()}", "type": "function_call",
            "function": {"name": name, "arguments": arguments}}


def envelope(item: Mapping[str, Any], *, auto_resume: bool, env_variables: Mapping[str, str] | None,
             callback_url: str | None = None, callback_secret_id: str | None = None) -> dict[str, Any]:
    """A call body: the item plus the API's optional envelope members."""
    body = dict(item)
    if auto_resume:
        body["auto_resume"] = True
    if env_variables:
        body["env_variables"] = [{"name": k, "value": v} for k, v in env_variables.items()]
    if callback_url:
        body["callback_url"] = callback_url
        if callback_secret_id:
            body["callback_secret_id"] = callback_secret_id
    return body


def _raw(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def call_op(env: str, sid: str, body: Mapping[str, Any], *, key: str | None = None) -> Op[dict[str, Any]]:
    """A sync tool call: its answer, or (202: it outlasted the API's sync wait) its job's JSON."""
    return Op(Request("POST", session_path(env, sid), body=_json(body),
                      headers={"idempotency-key": key or _key()}), _raw)


def _identity(value: Any) -> Any:
    return value


def submit_op(env: str, sid: str, body: Mapping[str, Any], *, key: str | None = None) -> Op[Job]:
    return Op(Request("POST", session_path(env, sid), body=_json(body),
                      headers={"idempotency-key": key or _key(), "prefer": "respond-async"}),
              Job.model_validate)


def lifecycle_op(env: str, sid: str, action: str, params: Mapping[str, Any] | None = None, *,
                 callback_url: str | None = None, key: str | None = None) -> Op[dict[str, Any]]:
    """resume / suspend / destroy: `{"status": "ok", ...}`, or (202: it outlasted the API's sync
    wait) its job's JSON."""
    body = _json({"callback_url": callback_url}) if callback_url else None
    method, path = ("DELETE", session_path(env, sid)) if action == "destroy" else \
        ("POST", f"{session_path(env, sid)}/{action}")
    headers = {"idempotency-key": key or _key()}
    return Op(Request(method, path, params=params, body=body, headers=headers), _raw)


def view_op(env: str, sid: str) -> Op[SessionInfo]:
    return Op(Request("GET", session_path(env, sid)), SessionInfo.model_validate)


#: A page of a listing and the cursor of the next one (None after the last page).
Page = tuple[list[T], str | None]


def sessions_op(env: str, cursor: str, limit: int) -> Op[Page[SessionInfo]]:
    """`GET .../sessions`, a page at `cursor` ("" the first)."""
    def page(body: Any) -> Page[SessionInfo]:
        sessions = [SessionInfo.model_validate(s) for s in body["sessions"]]
        following = str(body.get("next_cursor") or "0")  # a SCAN cursor: "0" after the last page
        return sessions, None if following == "0" else following

    return Op(Request("GET", f"/v1/environments/{quote(env, safe='')}/sessions",
                      params={"cursor": cursor or "0", "limit": limit}), page)


def environments_op() -> Op[list[Environment]]:
    return Op(Request("GET", "/v1/environments"),
              lambda body: [Environment.model_validate(e) for e in body["environments"]])


def tools_op(env: str, fmt: str) -> Op[list[dict[str, Any]]]:
    return Op(Request("GET", f"/v1/environments/{quote(env, safe='')}/tools", params={"format": fmt}),
              lambda body: list(body["tools"]))


def job_op(job_id: str, wait_s: float = 0) -> Op[Job]:
    params = {"wait": wait_s} if wait_s else None
    return Op(Request("GET", f"/v1/jobs/{quote(job_id, safe='')}", params=params), Job.model_validate)


def wait_jobs_op(job_ids: list[str], timeout_s: float) -> Op[list[Job]]:
    """The listed jobs ended, answered as soon as one is; [] after `timeout_s`."""
    return Op(Request("POST", "/v1/jobs:wait", body=_json({"ids": job_ids, "timeout_s": timeout_s})),
              lambda body: [Job.model_validate(j) for j in body["jobs"]], safe=True)


def cancel_op(job_id: str) -> Op[Job]:
    return Op(Request("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel"), Job.model_validate)


def events_request(job_id: str, last_event_id: str | None) -> Request:
    headers = {"accept": "text/event-stream"}
    if last_event_id:
        headers["last-event-id"] = last_event_id
    return Request("GET", f"/v1/jobs/{quote(job_id, safe='')}/events", headers=headers)


def batch_op(calls: Iterable[Mapping[str, Any]], *, key: str | None = None) -> Op[list[Job]]:
    """`calls`: tool-call items each with `environment` and `session` members."""
    return Op(Request("POST", "/v1/jobs:batch", body=_json({"calls": list(calls)}),
                      headers={"idempotency-key": key or _key()}),
              lambda body: [Job.model_validate(j) for j in body["jobs"]])


def get_op(path: str, params: Mapping[str, Any] | None = None) -> Op[Any]:
    """Any other GET of the API, its JSON as is."""
    return Op(Request("GET", path, params=params), _identity)


def capacity_op() -> Op[dict[str, Any]]:
    return Op(Request("GET", "/v1/capacity"), dict)


def audit_op(filters: Mapping[str, str], cursor: str, limit: int) -> Op[Page[dict[str, Any]]]:
    """`GET /v1/audit`: records oldest first (admin scope); the listing ends at an empty page."""
    def page(body: Any) -> Page[dict[str, Any]]:
        records = list(body["records"])
        return records, (body.get("next_cursor") or None) if records else None

    params = {**{k: v for k, v in filters.items() if v}, "cursor": cursor or None, "limit": limit}
    return Op(Request("GET", "/v1/audit", params=params), page)


def dlq_page_op(cursor: str, limit: int) -> Op[Page[dict[str, Any]]]:
    """`GET /v1/dlq`: dead-lettered jobs, newest first (admin scope)."""
    def page(body: Any) -> Page[dict[str, Any]]:
        return list(body["entries"]), body.get("next_cursor") or None

    return Op(Request("GET", "/v1/dlq", params={"cursor": cursor or None, "limit": limit}), page)


def _dlq_entry_path(entry_id: str) -> str:
    return f"/v1/dlq/{quote(entry_id, safe='')}"


def dead_letter_op(entry_id: str) -> Op[dict[str, Any]]:
    """One DLQ entry and its job."""
    return Op(Request("GET", _dlq_entry_path(entry_id)), dict)


def replay_op(entry_id: str) -> Op[Job]:
    """Re-enqueue a dead letter's job (same id) at its session's tail; answers the job."""
    return Op(Request("POST", f"{_dlq_entry_path(entry_id)}/replay"), Job.model_validate)


def discard_op(entry_id: str) -> Op[None]:
    return Op(Request("DELETE", _dlq_entry_path(entry_id)), _nothing)


def _nothing(value: Any) -> None:
    return None


def tool_result(answer: Any) -> ToolResult:
    return ToolResult.model_validate(answer)


def job_outcome(job: Job) -> dict[str, Any]:
    """A finished job's result; its problem raised when it failed or was cancelled."""
    if job.state == "succeeded":
        return job.result or {}
    if job.state == "cancelled":
        raise problem_error(Problem(type="https://atefleet.dev/problems/cancelled", title="Job cancelled",
                                    status=409, detail=f"job {job.id} was cancelled", job_id=job.id))
    raise problem_error(Problem.model_validate({**(job.error or {}), "job_id": job.id}))
