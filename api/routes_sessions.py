"""Session routes: the seed's resume / suspend / execute, plus destroy, show and list.

Seed 000 compatibility is exact on its three routes: same paths, same bodies, same answers
(`{"status": "ok"}` and `function_call_output`), with extra fields only added next to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from api.fleet import BEARER_DOC, Fleet, FleetDep, PrincipalDep, caller, fleet_and_caller
from api.ownership import check_access, check_callback_secret, may_see_session, session_not_found, tenancy_of
from api.policy import check_call
from api.problems import InvalidToolCall, NotFound
from api.session_view import session_view
from api.submit import JsonResponse, submit, tool_job, wants_async
from api.tool_calls import decode_json_body, fingerprint, parse_callback, parse_tool_call
from common.queue import JobKind, NewJob
from common.tool_calls import render_tool_not_allowed

router = APIRouter(prefix="/v1/environments/{env}/sessions", tags=["sessions"])

#: Session ids appear in Redis keys and actor names; keep them to a safe alphabet.
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
Sid = Annotated[str, Path(pattern=SESSION_ID_PATTERN, description="client-chosen session id")]


async def _lifecycle(request: Request, env: str, sid: str, kind: JobKind, **payload: Any) -> Response:
    """Enqueue a lifecycle job. The seed sends no body; an optional JSON one may carry `async`,
    `callback_url` and `callback_secret_id`, as on any job."""
    fleet, principal = await fleet_and_caller(request)
    environment = fleet.environment(env)
    await check_access(fleet, principal, env, sid, str(kind))
    raw = await request.body()
    body = decode_json_body(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise InvalidToolCall("the body, when given, must be a JSON object", field="body")
    url, secret_id = parse_callback(body, fleet.config.webhooks.secrets.keys())
    await check_callback_secret(fleet, principal, secret_id, str(kind))
    job = NewJob(environment=env, session_id=sid, kind=kind, payload=payload, principal=principal.id,
                 callback_url=url, callback_secret_id=secret_id, tenancy=tenancy_of(principal, environment))
    return await submit(fleet, request.headers, job,
                        lambda: f"{job.session}:{kind}:{sorted(payload.items())}:{url}:{secret_id}",
                        sync=not wants_async(request.headers, body.get("async") is True))


@router.post("/{sid}/resume", summary="Create (if needed) and resume the session's actor",
             openapi_extra=BEARER_DOC)
async def resume(request: Request, env: str, sid: Sid) -> Response:
    return await _lifecycle(request, env, sid, JobKind.RESUME)


@router.post("/{sid}/suspend", summary="Suspend the session's actor, after every call queued before",
             openapi_extra=BEARER_DOC)
async def suspend(request: Request, env: str, sid: Sid, force: bool = False) -> Response:
    return await _lifecycle(request, env, sid, JobKind.SUSPEND, force=force)


@router.delete("/{sid}", summary="Destroy the session (optionally keeping its snapshot)",
               openapi_extra=BEARER_DOC)
async def destroy(request: Request, env: str, sid: Sid, keep_snapshot: bool = False) -> Response:
    return await _lifecycle(request, env, sid, JobKind.DESTROY, keep_snapshot=keep_snapshot)


@router.post("/{sid}", summary="Execute one tool call in the session's actor",
             openapi_extra={**BEARER_DOC, "requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"type": "object", "description": "seed function_call, Anthropic tool_use "
                            "or Chat Completions tool_calls item"}}}}})
async def execute(request: Request, env: str, sid: Sid) -> Response:
    # Served by api.hot_path, which calls `tool_call` itself; declared here for the OpenAPI document.
    return await tool_call(request.app.state.fleet, request.headers, request.body, env, sid)


async def tool_call(fleet: Fleet, headers: Mapping[str, str], body: Callable[[], Awaitable[bytes]],
                    env: str, sid: str) -> Response:
    """The answer to one tool call; `headers` by lower-case name, `body()` reads the request body
    (after authentication)."""
    principal = await caller(fleet, headers)
    environment = fleet.environment(env)
    await check_access(fleet, principal, env, sid, "call")
    # Like the seed's decoder: JSON whatever the Content-Type (`curl -d` sends a form type).
    call = parse_tool_call(decode_json_body(await body()),
                           webhook_secret_ids=fleet.config.webhooks.secrets.keys())
    if call.name not in environment.allowed_tools:
        return JsonResponse(render_tool_not_allowed(call, env))
    await check_call(fleet, principal, env, sid, call)
    await check_callback_secret(fleet, principal, call.callback_secret_id, call.name)
    job = tool_job(fleet, principal.id, env, sid, call, tenancy_of(principal, environment))
    return await submit(fleet, headers, job, lambda: fingerprint(call, job.session),
                        sync=not wants_async(headers, call.is_async))


@router.get("/{sid}", summary="The session's state, actor, activity, queue and processes",
            response_model=dict[str, Any], openapi_extra=BEARER_DOC)
async def show(request: Request, env: str, sid: Sid) -> Response:
    # Served by api.hot_path, which calls `session` itself; declared here for the OpenAPI document.
    return await session(request.app.state.fleet, request.headers, env, sid)


async def session(fleet: Fleet, headers: Mapping[str, str], env: str, sid: str) -> Response:
    """The session's view; `headers` by lower-case name."""
    principal = await caller(fleet, headers)
    environment = fleet.environment(env)
    await check_access(fleet, principal, env, sid, "view")
    info = await session_view(fleet.queue, environment, sid)
    if info is None:
        raise NotFound(f"session {sid!r} does not exist in {env!r}", environment=env, session=sid)
    if not may_see_session(principal, environment, info["owner"]):
        raise await session_not_found(fleet, principal.id, env, sid, "view")
    return JsonResponse(info)


@router.get("", summary="Sessions of an environment, paginated")
async def list_sessions(fleet: FleetDep, principal: PrincipalDep, env: str, cursor: str = "",
                        limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
    await check_access(fleet, principal, env, None, "list")
    environment = fleet.environment(env)
    ids, next_cursor = await fleet.queue.list_sessions(env, cursor, limit)
    visible = [sid for sid in ids if principal.may_use(env, sid)]
    views = await asyncio.gather(*(session_view(fleet.queue, environment, sid) for sid in visible))
    # A page may hold fewer than `limit` sessions (others' are left out); `next_cursor` goes on.
    mine = [v for v in views if v is not None and may_see_session(principal, environment, v["owner"])]
    return {"sessions": mine, "next_cursor": next_cursor}
