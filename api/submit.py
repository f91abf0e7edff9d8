"""Submitting a job and answering for it: sync (wait, then the result), or async (202 + Location).

One path for every job-creating route, so idempotency, async preference, the sync wait limit and
the translation of a failed job into problem+json behave the same everywhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.responses import Response

from api import ownership, quotas
from api.fleet import Fleet
from api.problems import ApiProblem, Conflict, IdempotencyConflict
from common.config import Config, EnvLimits
from common.job_json import job_to_json
from common.metrics import JOBS_ENQUEUED, Children
from common.queue import EnqueueResult, JobKind, JobRecord, JobState, NewJob, Outcome
from common.queue import IdempotencyConflict as QueueIdempotencyConflict
from common.queue.models import QuotaRefused, SessionNotOwned, Tenancy
from common.queue.queue import new_job_id
from common.queue.scripts import audit_op
from common.secret_box import SEALED_ENV_KEY
from common.tool_calls import ToolCall

log = logging.getLogger("atefleet.api")

_ENQUEUED = Children(JOBS_ENQUEUED)  # one labelled child per job kind, looked up once

#: What starlette's JSONResponse renders (compact UTF-8, no NaN), as one encoder built once:
#: `json.dumps` with arguments builds a new encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))

#: Added to the longest a job may take (its tool, a wait for a worker, a resume and a suspend)
#: for the steps around them: the handoff, binding the guest, answering.
SYNC_SLACK_S = 30.0

#: The header of every answer to an async submit (RFC 7240).
_PREFERENCE_APPLIED = (b"preference-applied", b"respond-async")


class JsonResponse(Response):
    """starlette's JSONResponse, same bytes and headers, at a third of its CPU (the answer of every
    job-creating request). `headers` are raw (lower-case name, value) pairs."""

    media_type = "application/json"

    def __init__(self, content: Any, status_code: int = 200,
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        # Response.__init__ is skipped on purpose (as starlette's StreamingResponse does): its
        # header normalisation is what costs, and these headers are already raw.
        self.status_code = status_code
        self.background = None
        self.body = _JSON.encode(content).encode()
        self.raw_headers = [*headers, (b"content-length", b"%d" % len(self.body)),
                            (b"content-type", b"application/json")]


def prefer_wait_s(headers: Mapping[str, str]) -> float | None:
    """`Prefer: wait=N` (RFC 7240 section 4.3): the client wants an answer within N seconds."""
    prefer = headers.get("prefer")
    if not prefer:
        return None
    for preference in prefer.split(","):
        name, _, value = preference.split(";", 1)[0].partition("=")
        if name.strip().lower() == "wait":
            seconds = value.strip().strip('"')
            return float(seconds) if seconds.isdigit() else None  # else ignored, as RFC 7240 says
    return None


def sync_limit_s(config: Config, headers: Mapping[str, str], job: NewJob) -> float:
    """How long a sync request waits before answering 202: `Prefer: wait=N` when sent, else
    `jobs.sync_wait_s` when set, else as long as the job may take. A seed-shaped tool call thus
    waits for its tool (bounded by the tool's own timeout), as the seed's clients expect."""
    wanted = prefer_wait_s(headers)
    if wanted is None and config.jobs.sync_wait_s:
        return config.jobs.sync_wait_s
    bound = _job_bound_s(config, job)
    return bound if wanted is None else min(wanted, bound)


def _job_bound_s(config: Config, job: NewJob) -> float:
    """The longest the job may take: its tool's timeout (a tool call), a wait for a worker, a
    resume and a suspend, and slack."""
    lifecycle_s = 2 * config.ate.lifecycle_deadline_s + SYNC_SLACK_S
    if job.kind is JobKind.TOOL:
        env = config.environment(job.environment)
        limits = env.limits if env is not None else EnvLimits()
        asked = (job.payload.get("arguments") or {}).get("timeout")
        tool_s = asked if isinstance(asked, int | float) and asked > 0 else limits.timeout_default_s
        return min(tool_s, limits.timeout_max_s) + config.workers.capacity_wait_s + lifecycle_s
    if job.kind is JobKind.RESUME:
        return config.workers.capacity_wait_s + lifecycle_s
    return lifecycle_s


def wants_async(headers: Mapping[str, str], body_flag: bool = False) -> bool:
    """`Prefer: respond-async` (RFC 7240) or an `async` flag in the body."""
    prefer = headers.get("prefer", "")
    return body_flag or any(p.strip().lower() == "respond-async" for p in prefer.split(","))


async def submit(fleet: Fleet, headers: Mapping[str, str], job: NewJob, fingerprint: Callable[[], str],
                 sync: bool, wait_s: float | None = None) -> Response:
    """Enqueue the job (with the request's Idempotency-Key), then answer: sync waits up to the
    configured limit for its result or problem, else (or when async) 202 with the job.

    `fingerprint` gives the request's canonical hash; it is only computed under an Idempotency-Key."""
    key = headers.get("idempotency-key")
    if not sync:
        result = await _enqueue(fleet, key, job, fingerprint, new_job_id())
        return await _accepted(fleet, result.job_id, result.record)
    limit_s = wait_s if wait_s is not None else sync_limit_s(fleet.config, headers, job)
    job_id = new_job_id()
    # Watched before it exists: the answer then comes from the done notification alone.
    with fleet.waiter.watch(job_id) as watch:
        result = await _enqueue(fleet, key, job, fingerprint, job_id)
        if result.created:
            outcome = await watch.outcome(limit_s)
    if not result.created:  # an idempotent replay: that job may have ended long ago
        with fleet.waiter.follow(result.job_id) as watch:
            outcome = await watch.outcome(limit_s)
    if outcome is None:  # not done within the limit: 202 with the job as it is now
        return await _accepted(fleet, result.job_id)
    if outcome.state == JobState.SUCCEEDED:
        return JsonResponse(outcome.result or {})
    raise problem_of(result.job_id, outcome)


async def _accepted(fleet: Fleet, job_id: str, record: JobRecord | None = None) -> Response:
    """202 with `record`, or the job as Redis has it now (a replay, or a sync call past its limit)."""
    record = record or await fleet.queue.get_job(job_id)
    if record is None:  # expired between enqueue and now: only with absurdly short TTLs
        raise Conflict("the job expired before it could be answered", job_id=job_id)
    return accepted(record)


async def _enqueue(fleet: Fleet, key: str | None, job: NewJob, fingerprint: Callable[[], str],
                   job_id: str) -> EnqueueResult:
    """Enqueue (owner-checked, within quotas, audited by the enqueue script; see api.ownership)."""
    try:
        result = await fleet.queue.enqueue(job, idempotency_key=key, job_id=job_id,
                                           fingerprint=fingerprint() if key else None,
                                           quotas=fleet.config.quotas.of(job.principal))
    except QueueIdempotencyConflict as err:
        raise IdempotencyConflict(
            "this Idempotency-Key was used with a different request", job_id=err.job_id) from err
    except SessionNotOwned as err:
        raise await ownership.refused_enqueue(fleet, job.principal, err, audit_op(job)) from err
    except QuotaRefused as err:
        raise await quotas.refused_enqueue(fleet, job.principal, err, audit_op(job)) from err
    if result.created:
        _ENQUEUED(str(job.kind)).inc()
        fleet.audit.note_call(job.principal, job.environment, job.session_id, audit_op(job), result.job_id)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("job accepted", extra={"fields": {
            "job": result.job_id, "session": job.session, "principal": job.principal,
            "kind": str(job.kind), "replayed": not result.created}})
    return result


def accepted(job: JobRecord) -> Response:
    """202 with the job's location and JSON: the client polls, long-polls, streams or gets a callback."""
    return JsonResponse(job_to_json(job), status_code=202,
                        headers=[(b"location", f"/v1/jobs/{job.id}".encode()), _PREFERENCE_APPLIED])


def problem_of(job_id: str, outcome: Outcome) -> ApiProblem:
    """The problem+json a failed or cancelled job answers with on the sync route."""
    if outcome.state == JobState.CANCELLED:
        return Conflict("the job was cancelled before it finished", job_id=job_id)
    problem = outcome.error or {"status": 500, "title": "job failed"}
    return ApiProblem.from_dict({**problem, "job_id": job_id})


def tool_job(fleet: Fleet, principal_id: str, env: str, sid: str, call: ToolCall, tenancy: Tenancy) -> NewJob:
    """The job of a tool call; env var values travel sealed (see common.secret_box)."""
    secrets = {SEALED_ENV_KEY: fleet.secret_box.seal(call.env_variables)} if call.env_variables else None
    return NewJob(environment=env, session_id=sid, kind=JobKind.TOOL, principal=principal_id,
                  payload=call.job_payload(), secrets=secrets, tenancy=tenancy,
                  callback_url=call.callback_url, callback_secret_id=call.callback_secret_id)
