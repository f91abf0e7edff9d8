"""The routes every agent loop takes, served in front of FastAPI.

`POST /v1/environments/{env}/sessions/{sid}` is the API's hot path: one request per tool call,
thousands a second; `GET` on the same path (the session's view) is what an agent loop polls
between calls. Through FastAPI a tool call cost ~0.27 ms of CPU in-process, ~0.1 ms of it
FastAPI's own (router matching over every route, its middleware stack, request/response wrapping
and parameter solving), and a session's view about as much. `HotPath` matches that path itself
and calls the route's function (`api.routes_sessions.tool_call`, `.session`) directly, with the
request's headers and body read straight from the ASGI scope and `receive` (no starlette
Request), answering errors with the same problem+json mapping (`api.problems.as_problem`); every
other request goes on to the FastAPI app. FastAPI still declares both routes (`execute` and
`show`, calling the same functions), which is what the OpenAPI document shows.

What FastAPI would have checked here: the method and path (by this module's pattern), and the
session id's pattern (`SESSION_ID_PATTERN`, the same constant the declarations use). The body
limit wraps both (see `create_app`).
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from api.problems import ApiProblem, InternalError, Unprocessable, as_problem, problem_response
from api.routes_sessions import SESSION_ID_PATTERN, session, tool_call

log = logging.getLogger("atefleet.api")

#: The session's path, as FastAPI matches `/v1/environments/{env}/sessions/{sid}`.
SESSION_PATH = re.compile(r"/v1/environments/(?P<env>[^/]+)/sessions/(?P<sid>[^/]+)")
_SESSION_ID = re.compile(SESSION_ID_PATTERN)


class HotPath:
    """ASGI app: a session's tool call and view here, everything else to `app`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "GET"):
            match = SESSION_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._session_route(scope, receive, send, match["env"], match["sid"])
                return
        await self.app(scope, receive, send)

    async def _session_route(self, scope: Scope, receive: Receive, send: Send, env: str, sid: str) -> None:
        try:
            if _SESSION_ID.match(sid) is None:
                raise Unprocessable("the request does not validate", errors=[{
                    "field": "path.sid", "message": f"String should match pattern '{SESSION_ID_PATTERN}'"}])
            fleet, headers = self.app.state.fleet, headers_of(scope)
            if scope["method"] == "GET":
                response = await session(fleet, headers, env, sid)
            else:
                response = await tool_call(fleet, headers, lambda: read_body(receive), env, sid)
        except Exception as exc:
            problem = as_problem(exc)
            if isinstance(problem, InternalError) and not isinstance(exc, ApiProblem):
                log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            response = problem_response(problem, scope["path"])
        await response(scope, receive, send)


def headers_of(scope: Scope) -> dict[str, str]:
    """The request's headers by (lower-case, as ASGI gives them) name, the first of a repeated one
    as starlette's `Headers.get` answers: one pass, then a dict lookup per header the route reads
    (`Headers.get` scans them all for each, raising KeyError inside for every absent one)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(scope["headers"])}


async def read_body(receive: Receive) -> bytes:
    """The whole request body, read as starlette's `Request.body` reads it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
