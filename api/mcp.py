"""MCP (Model Context Protocol) over Streamable HTTP, one endpoint per session: `/mcp/{env}/{sid}`.

An agent that speaks MCP attaches a session's sandbox as a tool server. Built on the official
`mcp` SDK's low-level `Server` and its Streamable HTTP session manager, stateless (no MCP session
lives in one API process, so any process behind a balancer answers any request):

- `tools/list`: the environment's allowed tools, with their JSON schemas (`common.tool_schemas`);
- `tools/call`: the call goes through `api.routes_sessions.tool_call`, the same function every
  HTTP tool call runs (auth, rate limit, ownership, policy, audit, per-session order through the
  queue, auto-resume), submitted async; output chunks are sent as progress notifications while
  the job runs (when the client asked for progress), then the tool's answer is the result;
- skills (when `list_skills` / `activate_skill` are allowed) are MCP prompts: `prompts/list` lists
  the skills, `prompts/get` activates one and answers its instructions.

`?auto_resume=true` on the endpoint's URL sends every call with `auto_resume` (the session is
resumed for each call and suspended after it), for agents that keep no session lifecycle.

Same bearer auth as the rest of the API: a request without valid credentials is answered 401
problem+json before the MCP layer sees it, and an unknown environment 404.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from api.fleet import Fleet, caller
from api.hot_path import headers_of
from api.problems import ApiProblem, Forbidden, InternalError, NotFound, as_problem, problem_response
from api.routes_sessions import SESSION_ID_PATTERN, tool_call
from common.tool_schemas import TOOL_SCHEMAS

#: `/mcp` is mounted; what is left of the path is `/{env}/{sid}`.
_TARGET = re.compile(r"/(?P<env>[^/]+)/(?P<sid>[^/]+)/?")
_SESSION_ID = re.compile(SESSION_ID_PATTERN)

#: Where the endpoint leaves the request's target for the MCP handlers (an ASGI scope key).
SCOPE_KEY = "atefleet.mcp"

#: Longest one output read blocks before the job's state is checked again (ms).
OUTPUT_BLOCK_MS = 15000

#: A skill line of list_skills' output: `- name: description`.
_SKILL_LINE = re.compile(r"- (?P<name>[^:\s]+): (?P<description>.*)")


@dataclass(frozen=True)
class Target:
    """The session an MCP request is for, and the request's headers (for `tool_call`)."""

    fleet: Fleet
    env: str
    sid: str
    headers: dict[str, str]
    auto_resume: bool


class McpEndpoint:
    """ASGI app mounted at `/mcp`: checks the caller and the target, then hands over to MCP."""

    def __init__(self) -> None:
        server: Server[Any] = Server("atefleet", version="0.1.0", on_list_tools=_list_tools,
                                     on_call_tool=_call_tool, on_list_prompts=_list_prompts,
                                     on_get_prompt=_get_prompt)
        self.manager = StreamableHTTPSessionManager(server, stateless=True)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Open for the app's lifespan (the MCP manager's task group)."""
        async with self.manager.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            target = await _target(scope)
        except Exception as exc:
            await problem_response(as_problem(exc), scope["path"])(scope, receive, send)
            return
        await self.manager.handle_request({**scope, SCOPE_KEY: target}, receive, send)


async def _target(scope: Scope) -> Target:
    fleet: Fleet = scope["app"].state.fleet
    match = _TARGET.fullmatch(scope["path"].removeprefix(scope.get("root_path", "")))
    if match is None or _SESSION_ID.match(match["sid"]) is None:
        raise NotFound("MCP endpoints are /mcp/{environment}/{session}")
    headers = headers_of(scope)
    principal = await caller(fleet, headers)
    fleet.environment(match["env"])
    if not principal.may_use(match["env"], match["sid"]):
        raise Forbidden(f"not allowed to use session {match['sid']!r} of {match['env']!r}")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    auto_resume = query.get("auto_resume", ["false"])[-1].lower() in ("true", "1")
    return Target(fleet, match["env"], match["sid"], headers, auto_resume)


def _of(ctx: Any) -> Target:
    target: Target = ctx.request.scope[SCOPE_KEY]
    return target


# ---- tools -----------------------------------------------------------------------------------


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    target = _of(ctx)
    allowed = target.fleet.environment(target.env).allowed_tools
    return types.ListToolsResult(tools=[
        types.Tool(name=name, description=TOOL_SCHEMAS[name]["description"],
                   input_schema=TOOL_SCHEMAS[name]["parameters"])
        for name in allowed if name in TOOL_SCHEMAS])


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    try:
        answer = await run_tool(_of(ctx), params.name, dict(params.arguments or {}), ctx.session)
    except ApiProblem as problem:
        return _error_result(problem.to_dict())
    text = str(answer.get("output", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=bool(answer.get("is_error")))


def _error_result(problem: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(problem))],
                                is_error=True)


async def run_tool(target: Target, name: str, arguments: dict[str, Any], session: Any) -> dict[str, Any]:
    """The tool's answer, run as an async job through the tool-call route's own function; its
    output reported as progress while it runs. Raises the ApiProblem the route or the job gives."""
    body = json.dumps({"type": "function_call", "call_id": "mcp", "auto_resume": target.auto_resume,
                       "function": {"name": name, "arguments": arguments}})

    async def read_body() -> bytes:
        return body.encode()

    headers = {**target.headers, "prefer": "respond-async"}
    response = await tool_call(target.fleet, headers, read_body, target.env, target.sid)
    answer = json.loads(bytes(response.body))
    if response.status_code == 200:  # answered in-band (a tool the environment does not allow)
        return dict(answer)
    return await _follow(target.fleet, str(answer["id"]), session)


async def _follow(fleet: Fleet, job_id: str, session: Any) -> dict[str, Any]:
    after, sent = "0-0", 0
    while True:
        entries = await fleet.queue.read_output(job_id, after=after, block_ms=OUTPUT_BLOCK_MS)
        for entry_id, fields in entries:
            after = entry_id
            if fields.get("event") == "end":
                return await _outcome(fleet, job_id)
            sent += len(fields.get("data", ""))
            await session.report_progress(sent, None, fields.get("data", ""))
        if not entries:
            job = await fleet.queue.get_job(job_id)
            if job is None or job.terminal:
                return await _outcome(fleet, job_id)


async def _outcome(fleet: Fleet, job_id: str) -> dict[str, Any]:
    job = await fleet.queue.get_job(job_id)
    if job is None:
        raise InternalError("the job's record expired before its answer was read", job_id=job_id)
    if job.state == "succeeded":
        return dict(job.result or {})
    raise ApiProblem.from_dict({**(job.error or {"status": 409, "title": f"Job {job.state}"}),
                                "job_id": job_id})


# ---- skills as prompts ---------------------------------------------------------------------------


def _skills_allowed(target: Target) -> bool:
    allowed = target.fleet.environment(target.env).allowed_tools
    return "list_skills" in allowed and "activate_skill" in allowed


async def _list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    target = _of(ctx)
    if not _skills_allowed(target):
        return types.ListPromptsResult(prompts=[])
    listing = await run_tool(target, "list_skills", {}, ctx.session)
    prompts = []
    for line in str(listing.get("output", "")).split("\n\n", 1)[0].splitlines():
        match = _SKILL_LINE.fullmatch(line.strip())
        if match is not None:
            prompts.append(types.Prompt(name=match["name"], description=match["description"]))
    return types.ListPromptsResult(prompts=prompts)


async def _get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    target = _of(ctx)
    if not _skills_allowed(target):
        raise NotFound(f"environment {target.env!r} exposes no skills")
    skill = await run_tool(target, "activate_skill", {"name": params.name}, ctx.session)
    text = types.TextContent(type="text", text=str(skill.get("output", "")))
    return types.GetPromptResult(description=f"skill {params.name}",
                                 messages=[types.PromptMessage(role="user", content=text)])
