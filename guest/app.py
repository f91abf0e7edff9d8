"""The guest's HTTP routes: identity check, then executions, processes and readiness."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from typing import Any

from common.guest_protocol import ACTOR_HEADER
from guest.executions import BadRequest, Executions
from guest.identity import ActorIdentity, ActorMismatch
from guest.server import Request
from guest.spawn import KILL_GRACE_S, parse_signal

Answer = tuple[int, Any]
Route = Callable[[Request, re.Match[str]], Awaitable[Answer]]

_HEADER = ACTOR_HEADER.lower()


def _error(status: int, code: str, message: str, **extra: Any) -> Answer:
    return status, {"error": code, "message": message, **extra}


def _int_query(req: Request, name: str) -> int:
    value = req.query.get(name, "0")
    if not value.isdigit():
        raise BadRequest(f"{name} must be a non-negative integer")
    return int(value)


class GuestApp:
    def __init__(self, executions: Executions, identity: ActorIdentity) -> None:
        self.executions = executions
        self.identity = identity
        self._routes: list[tuple[str, re.Pattern[str], Route]] = [
            ("POST", re.compile(r"^/v1/executions$"), self._start),
            ("GET", re.compile(r"^/v1/executions$"), self._list),
            ("GET", re.compile(r"^/v1/executions/([^/]+)$"), self._poll),
            ("POST", re.compile(r"^/v1/executions/([^/]+)/cancel$"), self._cancel),
            ("GET", re.compile(r"^/v1/processes$"), self._processes),
        ]

    async def handle(self, req: Request) -> Answer:
        if req.path == "/readyz" and req.method == "GET":
            return 200, {"ready": True, "actor": self.identity.actor, "pid": os.getpid()}
        for method, pattern, route in self._routes:
            match = pattern.match(req.path)
            if match and method == req.method:
                return await self._guarded(req, match, route)
        return _error(404, "not_found", f"no route {req.method} {req.path}")

    async def _guarded(self, req: Request, match: re.Match[str], route: Route) -> Answer:
        actor = req.headers.get(_HEADER)
        if not actor:
            return _error(400, "missing_actor", f"the {ACTOR_HEADER} header is required")
        try:
            self.identity.check(actor)
        except ActorMismatch as err:
            return _error(403, "actor_mismatch", str(err), bound=err.bound)
        try:
            return await route(req, match)
        except (BadRequest, ValueError) as err:
            return _error(400, "bad_request", str(err))

    async def _start(self, req: Request, match: re.Match[str]) -> Answer:
        body = req.json()
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return 200, await self.executions.start(body)

    async def _poll(self, req: Request, match: re.Match[str]) -> Answer:
        wait_s = float(req.query.get("wait_s", "0"))
        view = await self.executions.poll(
            match[1], _int_query(req, "stdout_offset"), _int_query(req, "stderr_offset"), wait_s
        )
        return (200, view) if view is not None else _error(404, "not_found", f"no execution {match[1]!r}")

    async def _cancel(self, req: Request, match: re.Match[str]) -> Answer:
        body = req.json() or {}
        sig = parse_signal(body.get("signal"))
        grace_s = float(body.get("grace_s", KILL_GRACE_S))
        view = await self.executions.cancel(match[1], sig, grace_s)
        return (200, view) if view is not None else _error(404, "not_found", f"no execution {match[1]!r}")

    async def _list(self, req: Request, match: re.Match[str]) -> Answer:
        return 200, {"executions": self.executions.list()}

    async def _processes(self, req: Request, match: re.Match[str]) -> Answer:
        return 200, {"processes": self.executions.processes.list()}
