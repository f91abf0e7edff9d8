"""The UI's pages, live streams and actions under `/ui` (see `api.ui` for the parts).

Pages are plain HTML that read fine with JavaScript off; `static/ui.js` makes the live parts live:
the overview panel is re-rendered on the server every `OVERVIEW_PERIOD_S` and pushed over SSE (one
renderer for the first load and the updates), a running job's output streams over SSE. Actions
are POST forms with a CSRF token and a required "confirm" box, answered by a redirect.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from api import routes_dlq
from api.auth import Principal
from api.fleet import Fleet, caller
from api.problems import BadRequest, NotFound, Unauthorized
from api.routes_jobs import output_events
from api.routes_sessions import SESSION_ID_PATTERN
from api.ui import views
from api.ui.charts import line_chart
from api.ui.login import COOKIE, COOKIE_MAX_AGE_S, LoginRequired, check_csrf, csrf_token, ui_principal
from common.job_json import rfc3339
from common.queue import JobKind, JobState, NewJob

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["line_chart"] = line_chart
templates.env.filters["ts"] = lambda unix_s: rfc3339(unix_s) or "–"

#: How often the overview's live panel is re-rendered for a viewer (s).
OVERVIEW_PERIOD_S = 2.0

#: Lifecycle actions a session page offers: job kind and payload, as the API's routes enqueue them.
_ACTIONS: dict[str, tuple[JobKind, dict[str, Any]]] = {
    "resume": (JobKind.RESUME, {}),
    "suspend": (JobKind.SUSPEND, {"force": False}),
    "destroy": (JobKind.DESTROY, {"keep_snapshot": False}),
}

router = APIRouter(prefix="/ui", include_in_schema=False)
Operator = Annotated[Principal, Depends(ui_principal)]


def _fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.state.fleet
    return fleet


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    fleet = _fleet(request)
    return templates.TemplateResponse(request, name, {
        "csrf": csrf_token(request), "auth": fleet.config.auth.enabled,
        "environments": [e.name for e in fleet.config.environments], **context})


def _sse(event: str, html: str) -> bytes:
    data = "".join(f"data: {line}\n" for line in html.splitlines())
    return f"event: {event}\n{data}\n".encode()


# -- login ---------------------------------------------------------------------------------------

@router.get("/login")
async def login_form(request: Request) -> HTMLResponse:
    return _page(request, "login.html", error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the token as the API would, then keep it in the UI's cookie."""
    fleet = _fleet(request)
    token = str((await request.form()).get("token") or "").strip()
    try:
        principal = await caller(fleet, {"authorization": f"Bearer {token}"})
    except Unauthorized:
        return _login_refused(request, "This token is not valid.", 401)
    if not principal.admin:
        return _login_refused(request, "This token is valid but lacks the admin scope the UI needs.", 403)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


def _login_refused(request: Request, error: str, status: int) -> HTMLResponse:
    page = _page(request, "login.html", error=error)
    page.status_code = status
    return page


@router.post("/logout")
async def logout(request: Request, _op: Operator) -> Response:
    check_csrf(request, await request.form())
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return response


# -- overview ------------------------------------------------------------------------------------

@router.get("")
async def overview(request: Request, _op: Operator) -> HTMLResponse:
    return _page(request, "overview.html", o=await views.overview(_fleet(request)))


@router.get("/overview/live")
async def overview_live(request: Request, _op: Operator) -> StreamingResponse:
    fleet = _fleet(request)
    panel = templates.env.get_template("_overview_panel.html")

    async def updates() -> AsyncIterator[bytes]:
        while True:
            yield _sse("overview", panel.render(o=await views.overview(fleet)))
            await asyncio.sleep(OVERVIEW_PERIOD_S)

    return StreamingResponse(updates(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# -- sessions ------------------------------------------------------------------------------------

@router.get("/sessions")
async def sessions(request: Request, _op: Operator, env: str = "", state: str = "", owner: str = "",
                   cursor: str = "") -> HTMLResponse:
    fleet = _fleet(request)
    env = env or fleet.config.environments[0].name
    fleet.environment(env)
    rows, next_cursor = await views.session_rows(fleet, env, state, owner, cursor)
    return _page(request, "sessions.html", rows=rows, next_cursor=next_cursor, env=env, state=state,
                 owner=owner)


def _sid(sid: str) -> str:
    if not re.fullmatch(SESSION_ID_PATTERN, sid):
        raise BadRequest("not a session id", session=sid[:64])
    return sid


@router.get("/sessions/{env}/{sid}")
async def session(request: Request, _op: Operator, env: str, sid: str) -> HTMLResponse:
    detail = await views.session_detail(_fleet(request), env, _sid(sid))
    if detail is None:
        raise NotFound(f"session {sid!r} does not exist in {env!r}", environment=env, session=sid)
    return _page(request, "session.html", env=env, sid=sid, d=detail)


@router.post("/sessions/{env}/{sid}/{action}")
async def session_action(request: Request, op: Operator, env: str, sid: str, action: str) -> Response:
    form = await request.form()
    check_csrf(request, form)
    fleet = _fleet(request)
    fleet.environment(env)
    if action not in _ACTIONS or form.get("confirm") != "yes":
        raise BadRequest("choose resume, suspend or destroy, and tick the confirmation box")
    kind, payload = _ACTIONS[action]
    result = await fleet.queue.enqueue(NewJob(environment=env, session_id=_sid(sid), kind=kind,
                                              payload=payload, principal=op.id))
    await fleet.audit.record("admin", op.id, op=f"ui_{action}", env=env, sid=sid, job=result.job_id)
    return RedirectResponse(f"/ui/jobs/{result.job_id}", status_code=303)


# -- jobs ----------------------------------------------------------------------------------------

@router.get("/jobs")
async def jobs(request: Request, _op: Operator, id: str = "", session: str = "", state: str = "",
               before: int | None = Query(None, ge=0)) -> Response:
    fleet = _fleet(request)
    if id:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", id.strip()):
            raise BadRequest("not a job id", job_id=id[:64])
        return RedirectResponse(f"/ui/jobs/{id.strip()}", status_code=303)
    if state and state not in {s.value for s in JobState}:
        raise BadRequest("state must be one of " + ", ".join(s.value for s in JobState))
    next_before = None
    if session:
        env, _, sid = session.partition("/")
        fleet.environment(env)
        ids = await views.stats_of(fleet).session_jobs(f"{env}/{_sid(sid)}", views.PAGE_ROWS)
        rows = [r for r in await views.job_rows(fleet, ids) if not state or r["state"] == state]
    else:
        rows, next_before = await views.jobs_by_state(fleet, state, before)
    return _page(request, "jobs.html", rows=rows, session=session, state=state, next_before=next_before,
                 states=[s.value for s in JobState])


@router.get("/jobs/{job_id}")
async def job(request: Request, op: Operator, job_id: str) -> HTMLResponse:
    fleet = _fleet(request)
    record = await fleet.visible_job(job_id, op)
    return _page(request, "job.html", d=await views.job_detail(fleet, record))


@router.get("/jobs/{job_id}/live")
async def job_live(request: Request, op: Operator, job_id: str, after: str = "0-0") -> StreamingResponse:
    fleet = _fleet(request)
    await fleet.visible_job(job_id, op)
    ms, _, seq = after.partition("-")
    if not (ms.isdigit() and seq.isdigit()):
        raise BadRequest("after must be an output stream id")
    return StreamingResponse(output_events(fleet, job_id, after), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# -- dead-letter queue ---------------------------------------------------------------------------

@router.get("/dlq")
async def dlq(request: Request, _op: Operator, cursor: str = "") -> HTMLResponse:
    fleet = _fleet(request)
    after = routes_dlq.checked_entry_id(cursor) if cursor else None
    entries, next_cursor, size = await views.dlq_rows(fleet, after)
    return _page(request, "dlq.html", entries=entries, next_cursor=next_cursor, size=size)


@router.post("/dlq/{entry_id}/{action}")
async def dlq_action(request: Request, op: Operator, entry_id: str, action: str) -> Response:
    form = await request.form()
    check_csrf(request, form)
    fleet = _fleet(request)
    if action == "replay":
        job_id = await routes_dlq.replay(fleet, op, entry_id)
        return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)
    if action == "discard" and form.get("confirm") == "yes":
        await routes_dlq.discard(fleet, op, entry_id)
        return RedirectResponse("/ui/dlq", status_code=303)
    raise BadRequest("choose replay, or discard with the confirmation box ticked")


def install_ui(app: FastAPI) -> None:
    """Mount the UI on the API app: its routes, static files, and the login redirect."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    async def to_login(_request: Request, _exc: Exception) -> Response:
        return RedirectResponse("/ui/login", status_code=303)

    app.add_exception_handler(LoginRequired, to_login)
