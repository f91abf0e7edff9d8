"""Job routes for orchestrators: poll / long-poll, SSE output streams, cancel, and batch submit."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api import ownership, quotas
from api.auth import Principal
from api.fleet import Fleet, FleetDep, PrincipalDep
from api.ownership import check_access, check_callback_secret, may_see_job, tenancy_of
from api.policy import check_call
from api.problems import (
    ApiProblem,
    BadRequest,
    IdempotencyConflict,
    InvalidToolCall,
    PayloadTooLarge,
    ToolNotAllowed,
    Unprocessable,
)
from api.routes_sessions import SESSION_ID_PATTERN
from api.submit import tool_job
from api.tool_calls import fingerprint, parse_tool_call
from common.job_json import job_to_json
from common.queue import EnqueueResult, JobRecord, NewJob
from common.queue import IdempotencyConflict as QueueIdempotencyConflict
from common.queue.models import QuotaRefused, SessionNotOwned
from common.queue.scripts import audit_op
from common.tool_calls import ToolCall

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_SESSION_ID = re.compile(SESSION_ID_PATTERN)

#: SSE keep-alive comment period, below common proxy idle timeouts.
SSE_HEARTBEAT_MS = 15000

#: Most job ids one POST /v1/jobs:wait may list (each is read, and checked, per request).
WAIT_IDS_MAX = 1000


@router.get("/{job_id}", summary="A job's state and result; `wait` long-polls until it ends")
async def get_job(fleet: FleetDep, principal: PrincipalDep, job_id: str,
                  wait: float = Query(0, ge=0, description="seconds to wait for the job to end")) -> Any:
    job = await fleet.visible_job(job_id, principal)
    if wait > 0 and not job.terminal:
        await fleet.streams.check(fleet, principal, "long_poll")
        with fleet.streams.held(principal.id):
            done = await fleet.waiter.wait(job_id, min(wait, fleet.config.jobs.long_poll_max_s))
        job = done or await fleet.visible_job(job_id, principal)
    return job_to_json(job)


@router.post("/{job_id}/cancel", summary="Cancel a job: queued → removed; running → its process is killed")
async def cancel_job(fleet: FleetDep, principal: PrincipalDep, job_id: str) -> Any:
    await fleet.visible_job(job_id, principal)
    job = await fleet.queue.cancel(job_id)
    return job_to_json(job or await fleet.visible_job(job_id, principal))


def _sse(event: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def output_events(fleet: Fleet, job_id: str, after: str) -> AsyncIterator[bytes]:
    """Output chunks as they come, then the job's final JSON; ids are output-stream ids."""
    while True:
        entries = await fleet.queue.read_output(job_id, after=after, block_ms=SSE_HEARTBEAT_MS)
        if not entries:
            job = await fleet.queue.get_job(job_id)
            if job is None or job.terminal:
                if job is not None:
                    yield _sse("result", job_to_json(job))
                return
            yield b": keep-alive\n\n"
            continue
        for entry_id, fields in entries:
            after = entry_id
            if fields.get("event") == "end":
                job = await fleet.queue.get_job(job_id)
                if job is not None:
                    yield _sse("result", job_to_json(job), entry_id)
                return
            yield _sse("output", fields, entry_id)


@router.get("/{job_id}/events", summary="Server-sent events: output chunks, then the result")
async def job_events(fleet: FleetDep, principal: PrincipalDep, job_id: str,
                     last_event_id: str | None = Header(None)) -> Response:
    await fleet.visible_job(job_id, principal)
    after = last_event_id or "0-0"
    if not _is_stream_id(after):
        raise BadRequest("Last-Event-ID must be an id from this stream (e.g. 1700000000000-0)")
    await fleet.streams.check(fleet, principal, "events")
    return StreamingResponse(_held(fleet, principal.id, output_events(fleet, job_id, after)),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _held(fleet: Fleet, principal_id: str, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`events`, holding one of the principal's stream slots while they flow."""
    with fleet.streams.held(principal_id):
        async for chunk in events:
            yield chunk


def _is_stream_id(value: str) -> bool:
    ms, sep, seq = value.partition("-")
    return ms.isdigit() and (not sep or seq.isdigit())


def _batch_job(fleet: Fleet, principal: Principal, index: int, item: Any) -> tuple[NewJob, ToolCall]:
    if not isinstance(item, dict):
        raise InvalidToolCall("each call must be an object", field=f"calls.{index}")
    env_name, sid = item.get("environment"), item.get("session")
    if not isinstance(env_name, str) or not isinstance(sid, str) or not sid:
        raise InvalidToolCall("each call needs `environment` and `session`", field=f"calls.{index}")
    if _SESSION_ID.match(sid) is None:  # the rule every session route applies to its path
        raise Unprocessable("the request does not validate", errors=[{
            "field": f"calls.{index}.session",
            "message": f"String should match pattern '{SESSION_ID_PATTERN}'"}])
    environment = fleet.environment(env_name)
    call = parse_tool_call({k: v for k, v in item.items() if k not in ("environment", "session")},
                           webhook_secret_ids=fleet.config.webhooks.secrets.keys())
    if call.name not in environment.allowed_tools:
        raise ToolNotAllowed(call.name, env_name, index=index)
    return tool_job(fleet, principal.id, env_name, sid, call, tenancy_of(principal, environment)), call


@router.post(":batch", summary="Submit up to jobs.batch_max calls; per-session order = array order")
async def batch(fleet: FleetDep, principal: PrincipalDep, request: Request,
                body: dict[str, Any] = Body(...)) -> Response:  # noqa: B008
    calls = body.get("calls")
    if not isinstance(calls, list) or not calls:
        raise InvalidToolCall("`calls` must be a non-empty array", field="calls")
    if len(calls) > fleet.config.jobs.batch_max:
        raise InvalidToolCall(f"at most {fleet.config.jobs.batch_max} calls per batch", field="calls")
    planned = [_batch_job(fleet, principal, i, item) for i, item in enumerate(calls)]
    for i, (job, call) in enumerate(planned):
        try:  # each call checked as if sent alone; the first refused refuses the batch
            await check_access(fleet, principal, job.environment, job.session_id, "batch")
            await check_call(fleet, principal, job.environment, job.session_id, call)
            await check_callback_secret(fleet, principal, call.callback_secret_id, call.name)
        except ApiProblem as problem:
            problem.extensions["index"] = i
            raise
    # One Idempotency-Key covers the batch: call i is keyed `key#i`, so a replay returns the same
    # jobs and a different batch under the same key conflicts on the first call that differs.
    key = request.headers.get("idempotency-key")
    keys = [f"{key}#{i}" for i in range(len(planned))] if key else None
    prints = [fingerprint(c, j.session) for j, c in planned] if key else None
    try:
        results = await fleet.queue.enqueue_batch(
            [j for j, _ in planned], idempotency_keys=keys, fingerprints=prints,
            quotas=fleet.config.quotas.of(principal.id))
    except QueueIdempotencyConflict as err:
        raise IdempotencyConflict("this Idempotency-Key was used with a different batch",
                                  job_id=err.job_id) from err
    except SessionNotOwned as err:
        raise await ownership.refused_enqueue(fleet, principal.id, err, "batch", batch=True) from err
    except QuotaRefused as err:
        raise await quotas.refused_enqueue(fleet, principal.id, err, "batch", batch=True) from err
    for (job, _), result in zip(planned, results, strict=True):
        if result.created:
            fleet.audit.note_call(principal.id, job.environment, job.session_id, audit_op(job), result.job_id)
    jobs = await asyncio.gather(*(_record(fleet, r) for r in results))
    body_out = {"jobs": [job_to_json(j) for j in jobs if j is not None]}
    return JSONResponse(body_out, status_code=202)



@router.post(":wait", summary="Wait until one of the listed jobs ends; answers those ended by then")
async def wait_jobs(fleet: FleetDep, principal: PrincipalDep, body: dict[str, Any] = Body(...)) -> Any:  # noqa: B008
    """`{"ids": [...], "timeout_s": N}` → `{"jobs": [...]}`: the listed jobs that are terminal as
    soon as one is, or [] after `timeout_s` (at most `jobs.long_poll_max_s`). Every id is checked
    as GET /v1/jobs/{id} checks it: the first one the caller may not see refuses the request."""
    ids, timeout_s = body.get("ids"), body.get("timeout_s", 0)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise _invalid("ids", "must be a non-empty array of job ids")
    if len(ids) > WAIT_IDS_MAX:
        raise PayloadTooLarge(f"at most {WAIT_IDS_MAX} ids per wait", field="ids", limit=WAIT_IDS_MAX)
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s < 0:
        raise _invalid("timeout_s", "must be a number of seconds >= 0")
    if timeout_s == 0:
        jobs = await _read_jobs(fleet, ids)
        await _check_visible(fleet, principal, ids, jobs)
        return {"jobs": [job_to_json(job) for job in jobs if job is not None and job.terminal]}
    await fleet.streams.check(fleet, principal, "long_poll")
    with fleet.streams.held(principal.id):
        ended = await fleet.waiter.wait_any(ids, min(timeout_s, fleet.config.jobs.long_poll_max_s),
                                            admit=lambda jobs: _check_visible(fleet, principal, ids, jobs))
    return {"jobs": [job_to_json(job) for job in ended]}


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable("the request does not validate", errors=[{"field": field, "message": message}])


async def _read_jobs(fleet: Fleet, ids: list[str]) -> list[JobRecord | None]:
    return await asyncio.gather(*(fleet.queue.get_job(job_id) for job_id in ids))


async def _check_visible(fleet: Fleet, principal: Principal, ids: list[str],
                         jobs: list[JobRecord | None]) -> None:
    """Raise what GET /v1/jobs/{id} answers for the first job read that the caller may not see
    (naming its `index`); only such a job is looked up again, by `fleet.visible_job`."""
    for index, (job_id, job) in enumerate(zip(ids, jobs, strict=True)):
        if job is None or not may_see_job(principal, job):
            try:
                await fleet.visible_job(job_id, principal)
            except ApiProblem as problem:
                problem.extensions["index"] = index
                raise


async def _record(fleet: Fleet, result: EnqueueResult) -> JobRecord | None:
    """The job as enqueued; a replayed one is read (it may have moved on since)."""
    return result.record or await fleet.queue.get_job(result.job_id)
