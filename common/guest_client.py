"""Async client of the guest protocol, used by workers to run tool calls inside actors.

Errors (one hierarchy for this boundary):

    GuestError                      anything that kept the call from getting an answer
    ├── GuestUnavailable            connect refused, socket missing, reset, timeout: infrastructure,
    │                               retry later (the job id makes the retry exactly-once)
    ├── ActorMismatch               the guest serves another actor (403): wrong actor address
    ├── ExecutionNotFound           poll/cancel for a job id the guest does not know (404)
    └── GuestProtocolError          any other non-2xx answer, an unreadable or oversized body, or a
                                    call held past its time limit

A tool's own failure (exit code 1, file not found) is not an error: it is the result.

The guest runs next to tenant code, so the worker does not trust its answers: each is bounded in
size (by the call's limits), and a call is given up (its execution cancelled) once it ran past
its `timeout_max_s` plus RUN_SLACK_S, whatever the guest keeps answering.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json as _json
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, cast

from common.guest_http import DEFAULT_MAX_BODY_BYTES, AnswerTooLarge, GuestHTTP, ProtocolError
from common.guest_protocol import (
    ACTOR_HEADER,
    DEFAULT_LIMITS,
    MAX_WAIT_S,
    TERMINAL_EXECUTION_STATES,
    ExecutionState,
    ExecutionSummary,
    ExecutionView,
    GuestAddress,
    Limits,
    ProcessInfo,
    ReadyInfo,
    StartRequest,
    ToolResult,
)

#: Called with ("stdout" | "stderr", text) for each output chunk, in order; may be async.
OutputCallback = Callable[[str, str], Awaitable[None] | None]

#: Network slack on top of the time a guest may hold an answer.
REQUEST_SLACK_S = 10.0

#: Connect timeout: a guest that does not accept within this is unavailable.
CONNECT_TIMEOUT_S = 5.0

#: Seconds past `timeout_max_s` the worker still waits for a call's end (the guest's own kill
#: grace and the last output), before it cancels the execution and fails the call.
RUN_SLACK_S = 30.0
#: JSON may spell a byte of output or file content as `\u00XX`: six bytes.
_JSON_BYTES_PER_BYTE = 6
#: Room for everything in an answer besides output and file content.
_ANSWER_OVERHEAD_BYTES = 1 << 20


def answer_bound(limits: Limits | None) -> int:
    """Largest answer a call within `limits` can legitimately get: a result with both streams'
    kept output and a file's content, each JSON-escaped at worst."""
    lim = limits or DEFAULT_LIMITS
    output = lim.get("output_max_bytes", DEFAULT_LIMITS["output_max_bytes"])
    payload = 2 * output + lim.get("file_max_bytes", DEFAULT_LIMITS["file_max_bytes"])
    return max(DEFAULT_MAX_BODY_BYTES, _JSON_BYTES_PER_BYTE * payload + _ANSWER_OVERHEAD_BYTES)


class GuestError(Exception):
    """The guest could not be asked or did not answer properly."""


class GuestUnavailable(GuestError):
    """The guest is not reachable (refused, missing socket, reset, timeout): retryable."""


class ActorMismatch(GuestError):
    """The guest serves another actor; `bound` names it."""

    def __init__(self, message: str, bound: str | None) -> None:
        super().__init__(message)
        self.bound = bound


class ExecutionNotFound(GuestError):
    """The guest does not know this job id."""


class GuestProtocolError(GuestError):
    """An unexpected status or body; `status` is the HTTP status (0 when the body was unreadable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process (loading the CA bundle takes ~20 ms), for an https router."""
    return ssl.create_default_context()


class GuestClient:
    """One guest. Reuses its connection; call `aclose()` (or use `async with`) when done."""

    def __init__(self, address: GuestAddress, *, actor: str | None = None) -> None:
        headers = dict(address.headers)
        if actor is not None:
            headers[ACTOR_HEADER] = actor
        tls = _tls_context() if address.base_url.startswith("https:") else None
        self._http = GuestHTTP(address.base_url, address.uds, headers, tls, CONNECT_TIMEOUT_S)

    async def __aenter__(self) -> GuestClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---- raw protocol calls ---------------------------------------------------------------
    async def readyz(self) -> ReadyInfo:
        return cast(ReadyInfo, await self._call("GET", "/readyz"))

    async def start(self, request: StartRequest) -> ExecutionView:
        """Start (or attach to) the execution of `request["job_id"]`; waits ≤ `wait_s` (max 5 s)."""
        bound = answer_bound(request.get("limits"))
        return cast(ExecutionView, await self._call("POST", "/v1/executions", json=request, max_bytes=bound))

    async def poll(
        self, job_id: str, stdout_offset: int = 0, stderr_offset: int = 0, wait_s: float = MAX_WAIT_S,
        limits: Limits | None = None,
    ) -> ExecutionView:
        params = {
            "stdout_offset": stdout_offset,
            "stderr_offset": stderr_offset,
            "wait_s": min(wait_s, MAX_WAIT_S),
        }
        path, bound = f"/v1/executions/{job_id}", answer_bound(limits)
        return cast(ExecutionView, await self._call("GET", path, params=params, max_bytes=bound))

    async def cancel(
        self, job_id: str, signal: str | int = "SIGTERM", grace_s: float | None = None
    ) -> ExecutionView:
        """Signal the execution's process group (SIGKILL follows after `grace_s`); no-op when finished."""
        body: dict[str, Any] = {"signal": signal}
        if grace_s is not None:
            body["grace_s"] = grace_s
        return cast(ExecutionView, await self._call("POST", f"/v1/executions/{job_id}/cancel", json=body))

    async def list_executions(self) -> list[ExecutionSummary]:
        return cast(list[ExecutionSummary], (await self._call("GET", "/v1/executions"))["executions"])

    async def list_processes(self) -> list[ProcessInfo]:
        return cast(list[ProcessInfo], (await self._call("GET", "/v1/processes"))["processes"])

    # ---- the whole call -------------------------------------------------------------------
    async def run(
        self,
        job_id: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
        skills_dir: str | None = None,
        on_output: OutputCallback | None = None,
        cancelled: asyncio.Event | None = None,
    ) -> tuple[ToolResult, ExecutionView]:
        """Run a tool call to completion: start, then successive long-polls (each ≤ 5 s).

        Output chunks reach `on_output` in order as they come. When `cancelled` is set, the
        execution is cancelled once and followed until it ends. Returns the result and the last
        view (its `state` says finished or interrupted; `attached` that the job was already known).
        Past `timeout_max_s` + RUN_SLACK_S the execution is killed and GuestProtocolError raised.
        """
        lim = limits or DEFAULT_LIMITS
        timeout_max_s = lim.get("timeout_max_s", DEFAULT_LIMITS["timeout_max_s"])
        deadline = time.monotonic() + timeout_max_s + RUN_SLACK_S
        request: StartRequest = {"job_id": job_id, "tool": tool, "arguments": arguments, "wait_s": MAX_WAIT_S}
        if env:
            request["env"] = env
        if limits:
            request["limits"] = limits
        if skills_dir:
            request["skills_dir"] = skills_dir
        view = await self.start(request)
        attached = view["attached"]
        await _emit(view, on_output)
        cancel_sent = False
        while view["state"] not in TERMINAL_EXECUTION_STATES or view["more_output"]:
            if time.monotonic() > deadline:
                await self._overran(job_id)
            if cancelled is not None and cancelled.is_set() and not cancel_sent:
                cancel_sent = True
                await self.cancel(job_id)
            wait_s = 0.0 if view["more_output"] else MAX_WAIT_S
            poll = self.poll(job_id, view["stdout_offset"], view["stderr_offset"], wait_s, limits)
            answer = await (poll if cancel_sent or cancelled is None else _unless_set(poll, cancelled))
            if answer is not None:
                view = answer
                await _emit(view, on_output)
        view["attached"] = attached
        result = view["result"] or {"output": "", "is_error": True, "error": "no result"}
        return result, view

    async def _overran(self, job_id: str) -> None:
        """The guest kept the call past its limit: kill the execution (best effort) and fail."""
        try:
            await self.cancel(job_id, "SIGKILL")
        except GuestError:
            pass  # the call fails either way; a guest that cannot cancel is no reason to wait
        raise GuestProtocolError(f"job {job_id}: the guest held the call past timeout_max_s + "
                                 f"{RUN_SLACK_S:.0f} s; its execution was killed", 0)

    async def _call(
        self, method: str, path: str, *, json: Any = None, params: Mapping[str, object] | None = None,
        max_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> Any:
        """One request; `max_bytes` bounds the answer's body."""
        payload = None if json is None else _json.dumps(json).encode()
        timeout_s = MAX_WAIT_S + REQUEST_SLACK_S
        try:
            status, raw = await self._http.request(method, path, params=params, body=payload,
                                                   timeout_s=timeout_s, max_answer_bytes=max_bytes)
        except AnswerTooLarge as err:
            raise GuestProtocolError(f"{method} {path}: {err}", 0) from err
        except (OSError, TimeoutError, ProtocolError) as err:
            raise GuestUnavailable(f"guest unreachable on {method} {path}: {err!r}") from err
        try:
            body = _json.loads(raw)
        except ValueError as err:
            raise GuestProtocolError(f"{method} {path}: unreadable body (HTTP {status})", 0) from err
        if status == 200:
            return body
        _raise_for(status, body, f"{method} {path}")


def _raise_for(status: int, body: Any, what: str) -> None:
    code = body.get("error") if isinstance(body, dict) else None
    message = f"{what}: HTTP {status} {body.get('message', '') if isinstance(body, dict) else body}"
    if status == 403 and code == "actor_mismatch":
        raise ActorMismatch(message, body.get("bound"))
    if status == 404 and code == "not_found":
        raise ExecutionNotFound(message)
    if status in (502, 503, 504):
        raise GuestUnavailable(message)  # a router in front of a guest that is not up yet
    raise GuestProtocolError(message, status)


async def _unless_set(poll: Awaitable[ExecutionView], event: asyncio.Event) -> ExecutionView | None:
    """The poll's answer, or None (poll dropped) when `event` is set first: a cancel goes out at
    once instead of after the poll's up to 5 s."""
    task = asyncio.ensure_future(poll)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


async def _emit(view: ExecutionView, on_output: OutputCallback | None) -> None:
    if on_output is None:
        return
    for stream in ("stdout", "stderr"):
        data = view["stdout"] if stream == "stdout" else view["stderr"]
        if data:
            outcome = on_output(stream, data)
            if inspect.isawaitable(outcome):
                await outcome


__all__ = [
    "ActorMismatch",
    "ExecutionNotFound",
    "ExecutionState",
    "GuestClient",
    "GuestError",
    "GuestProtocolError",
    "GuestUnavailable",
    "OutputCallback",
]
