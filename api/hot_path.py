"""The route every tool call takes, served in front of FastAPI.

`POST /v1/environments/{env}/sessions/{sid}` is the API's hot path: one request per tool call,
thousands a second. Through FastAPI it cost ~0.27 ms of CPU in-process, ~0.1 ms of it FastAPI's
own (router matching over every route, its middleware stack, request/response wrapping and
parameter solving). `HotPath` matches that one route itself and calls its function
(`api.routes_sessions.tool_call`) directly, with the request's headers and body read straight from
the ASGI scope and `receive` (no starlette Request), answering errors with the same problem+json
mapping (`api.problems.as_problem`); every other request goes on to the FastAPI app. FastAPI still
declares the route (`execute`, calling the same function), which is what the OpenAPI document shows.

What FastAPI would have checked here: the method and path (by this module's pattern), and the
session id's pattern (`SESSION_ID_PATTERN`, the same constant the declaration uses). The body
limit wraps both (see `create_app`).
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from api.problems import ApiProblem, InternalError, Unprocessable, as_problem, problem_response
from api.routes_sessions import SESSION_ID_PATTERN, tool_call

log = logging.getLogger("atefleet.api")

#: The tool-call route's path, as FastAPI matches `/v1/environments/{env}/sessions/{sid}`.
TOOL_CALL_PATH = re.compile(r"/v1/environments/(?P<env>[^/]+)/sessions/(?P<sid>[^/]+)")
_SESSION_ID = re.compile(SESSION_ID_PATTERN)


class HotPath:
    """ASGI app: the tool-call route here, everything else to `app`."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = TOOL_CALL_PATH.fullmatch(scope["path"])
            if match is not None:
                await self._tool_call(scope, receive, send, match["env"], match["sid"])
                return
        await self.app(scope, receive, send)

    async def _tool_call(self, scope: Scope, receive: Receive, send: Send, env: str, sid: str) -> None:
        try:
            if _SESSION_ID.match(sid) is None:
                raise Unprocessable("the request does not validate", errors=[{
                    "field": "path.sid", "message": f"String should match pattern '{SESSION_ID_PATTERN}'"}])
            response = await tool_call(self.app.state.fleet, headers_of(scope), lambda: read_body(receive),
                                       env, sid)
        except Exception as exc:
            problem = as_problem(exc)
            if isinstance(problem, InternalError) and not isinstance(exc, ApiProblem):
                log.exception("unexpected error on POST %s", scope["path"])
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
