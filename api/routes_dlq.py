"""The dead-letter queue for operators (admin scope): list, inspect, replay, discard.

The UI's DLQ page acts through `replay` and `discard` here, so both surfaces refuse and audit alike.
An entry id is the `dlq` stream id (`<ms>-<seq>`) `GET /v1/dlq` lists.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from api.auth import Principal
from api.fleet import Fleet, FleetDep, PrincipalDep
from api.problems import BadRequest, Conflict, NotFound
from common.job_json import job_to_json, rfc3339
from common.queue.dlq import DeadLetter, DeadLetters, ReplayRefused, is_entry_id

router = APIRouter(prefix="/v1/dlq", tags=["dead-letter queue"])

#: Why a replay was refused, as the 409's detail.
_REFUSALS = {
    "expired": "the job's record expired (jobs are kept jobs.ttl_s after they end); the entry was dropped",
    "not_failed": "the job is no longer failed (already replayed?)",
    "secrets": "the call's env variable values were deleted when it failed; resubmit the call instead",
}


def entry_json(entry: DeadLetter) -> dict[str, Any]:
    return {"id": entry.id, "job_id": entry.job_id, "environment": entry.environment,
            "session": entry.session_id, "reason": entry.reason, "attempts": entry.attempts,
            "dead_at": rfc3339(entry.at_ms / 1000)}


def checked_entry_id(value: str) -> str:
    """`value` if it is a DLQ entry id, else a 400."""
    if not is_entry_id(value):
        raise BadRequest("a DLQ entry id looks like 1700000000000-0", entry=value[:64])
    return value


async def _entry(fleet: Fleet, entry_id: str) -> DeadLetter:
    entry = await DeadLetters(fleet.queue).get(checked_entry_id(entry_id))
    if entry is None:
        raise NotFound(f"DLQ entry {entry_id!r} does not exist", entry=entry_id)
    return entry


async def replay(fleet: Fleet, principal: Principal, entry_id: str) -> str:
    """Re-enqueue the entry's job at its session's tail (admin only); the job id."""
    principal.check_admin()
    entry = await _entry(fleet, entry_id)
    job = await fleet.queue.get_job(entry.job_id)
    if job is not None and job.payload.get("env_names"):
        raise Conflict(_REFUSALS["secrets"], entry=entry_id, job_id=entry.job_id, reason="secrets")
    try:
        job_id = await DeadLetters(fleet.queue).replay(entry.id)
    except ReplayRefused as err:
        if err.reason == "missing":
            raise NotFound(f"DLQ entry {entry_id!r} does not exist", entry=entry_id) from err
        raise Conflict(_REFUSALS[err.reason], entry=entry_id, job_id=err.job_id, reason=err.reason) from err
    await audit(fleet, principal, "dlq_replay", entry, job_id)
    return job_id


async def discard(fleet: Fleet, principal: Principal, entry_id: str) -> None:
    """Drop the entry (admin only); the failed job record stays until its TTL."""
    principal.check_admin()
    entry = await _entry(fleet, entry_id)
    if not await DeadLetters(fleet.queue).discard(entry.id):
        raise NotFound(f"DLQ entry {entry_id!r} does not exist", entry=entry_id)
    await audit(fleet, principal, "dlq_discard", entry, entry.job_id)


async def audit(fleet: Fleet, principal: Principal, op: str, entry: DeadLetter, job_id: str) -> None:
    """An operator's action, in the audit log."""
    await fleet.audit.record("admin", principal.id, op=op, env=entry.environment, sid=entry.session_id,
                             job=job_id)


@router.get("", summary="Dead-lettered jobs, newest first (admin)")
async def list_entries(fleet: FleetDep, principal: PrincipalDep, cursor: str = "",
                       limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    principal.check_admin()
    dlq = DeadLetters(fleet.queue)
    page, next_cursor = await dlq.page(checked_entry_id(cursor) if cursor else None, limit)
    return {"entries": [entry_json(e) for e in page], "next_cursor": next_cursor, "size": await dlq.size()}


@router.get("/{entry_id}", summary="One entry and its job (admin)")
async def show_entry(fleet: FleetDep, principal: PrincipalDep, entry_id: str) -> dict[str, Any]:
    principal.check_admin()
    entry = await _entry(fleet, entry_id)
    job = await fleet.queue.get_job(entry.job_id)
    return {**entry_json(entry), "job": job_to_json(job) if job is not None else None}


@router.post("/{entry_id}/replay", status_code=202,
             summary="Re-enqueue the job at its session's tail (admin)")
async def replay_entry(fleet: FleetDep, principal: PrincipalDep, entry_id: str) -> Response:
    job_id = await replay(fleet, principal, entry_id)
    job = await fleet.queue.get_job(job_id)
    return JSONResponse(job_to_json(job) if job is not None else {"id": job_id}, status_code=202,
                        headers={"Location": f"/v1/jobs/{job_id}"})


@router.delete("/{entry_id}", status_code=204, summary="Drop the entry; the job record stays (admin)")
async def discard_entry(fleet: FleetDep, principal: PrincipalDep, entry_id: str) -> Response:
    await discard(fleet, principal, entry_id)
    return Response(status_code=204)
