"""Executions: every tool call, by job id, exactly once.

A start for an unknown job id journals it and runs the tool: a tool that needs no waiting ends
within the start request, one that waits (bash, process) goes on as a task. A start for a
known id attaches to it (running) or returns its recorded outcome (finished or interrupted).
Answers wait for completion or new output, at most MAX_WAIT_S. Running executions keep their
output in memory (bounded); the RECENT newest finished ones too, older ones are served from the
journal's results.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from common.guest_protocol import DEFAULT_LIMITS, JOB_ID_PATTERN, MAX_WAIT_S, ExecutionState
from guest.journal import Journal, JournalEntry, compact_json, interrupted_result
from guest.output import BoundedOutput, utf8_safe_end
from guest.paths import PathResolver
from guest.procs import ProcessManager
from guest.tools import TOOLS
from guest.tools.base import Result, ToolContext, ToolError

log = logging.getLogger(__name__)

JOB_ID_RE = re.compile(JOB_ID_PATTERN)

#: Finished executions whose output stays in memory for polls by offset.
RECENT = 64

#: Output returned per stream in one answer; the client polls again for more.
POLL_CHUNK_BYTES = 256 << 10

#: Once output is waiting, an answer is held at most this long for more (fewer round trips).
COALESCE_S = 0.1

#: Grace between SIGTERM and SIGKILL for running commands when the guest stops.
STOP_GRACE_S = 1.0


class BadRequest(Exception):
    """The request itself is malformed (a worker bug, not a tool error): HTTP 400."""


@dataclass
class Execution:
    entry: JournalEntry
    ctx: ToolContext | None
    stdout: BoundedOutput
    stderr: BoundedOutput
    #: The result as recorded in the journal (compact JSON), once the execution ended.
    result_json: bytes | None = None
    task: asyncio.Task[None] | None = None
    #: One future per waiting poller, resolved on new output or completion: the poller's task
    #: wakes straight from it (asyncio.wait would add a callback hop and a loop iteration).
    waiters: list[asyncio.Future[bool]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.entry.state == ExecutionState.running

    def wake(self) -> None:
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def changed_within(self, timeout_s: float) -> bool:
        """Whether new output or completion came within `timeout_s`."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiters.append(waiter)
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self.waiters.remove(waiter)

    def pending(self, out_off: int, err_off: int) -> int:
        return max(0, self.stdout.total - out_off) + max(0, self.stderr.total - err_off)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


def _read(out: BoundedOutput, offset: int, final: bool) -> tuple[str, int, int]:
    if offset >= out.total:
        return "", offset, 0  # nothing new (a file tool writes no output at all)
    data, next_off, skipped = out.read_from(offset, POLL_CHUNK_BYTES)
    if not (final and next_off >= out.total):
        cut = utf8_safe_end(data)
        next_off -= len(data) - cut
        data = data[:cut]
    return data.decode("utf-8", errors="replace"), next_off, skipped


def _summary(tool: str, args: dict[str, Any]) -> str:
    for key in ("command", "cmd", "code", "path", "name", "action"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return value[:200]
    return ""


def _limits(raw: object) -> dict[str, Any]:
    """The call's limits: DEFAULT_LIMITS overridden by the valid keys of `raw`. Tools only read it."""
    limits: dict[str, Any] = dict(DEFAULT_LIMITS)
    if raw is None:
        return limits
    if not isinstance(raw, dict):
        raise BadRequest("limits must be an object")
    for key, value in raw.items():
        if key not in DEFAULT_LIMITS:
            continue  # limits the guest does not enforce per call (e.g. max_processes)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise BadRequest(f"limits.{key} must be a positive number")
        limits[key] = value
    return limits


def _failure(tool: str, job_id: str, err: Exception) -> dict[str, Any]:
    """The result of a tool that raised: its ToolError as the agent should see it, or a bug."""
    if isinstance(err, ToolError):
        return {"output": f"Error: {err}", "is_error": True, "error": str(err)}
    log.error("tool %s failed for job %s", tool, job_id, exc_info=err)
    return {"output": f"Error: internal error: {err}", "is_error": True, "error": f"internal error: {err}"}


class Executions:
    def __init__(
        self, journal: Journal, processes: ProcessManager, workspace: str, state_dir: str, skills_dir: str
    ) -> None:
        self.journal = journal
        self.processes = processes
        self.workspace = workspace
        # The workspace's real path, resolved once: each call only adds its skills directory.
        self._paths = PathResolver(workspace)
        #: Executions in _live still running (so pruning finished ones need not scan them all).
        self._running = 0
        self.state_dir = state_dir
        self.skills_dir = skills_dir
        self._live: OrderedDict[str, Execution] = OrderedDict()
        self.stopping = False

    # ---- start / poll / cancel: each answers an ExecutionView, encoded (see `_answer`) --------
    async def start(self, req: dict[str, Any]) -> bytes:
        job_id, tool, args = req.get("job_id"), req.get("tool"), req.get("arguments", {})
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise BadRequest(f"job_id must match {JOB_ID_PATTERN}")
        if not isinstance(tool, str) or not isinstance(args, dict):
            raise BadRequest("tool must be a string and arguments an object")
        wait_s = self._wait(req.get("wait_s", MAX_WAIT_S))
        known = self._live.get(job_id) or self._recorded(job_id)
        if known is not None:
            return await self._answer(known, 0, 0, wait_s, attached=True)
        if self.stopping:
            raise BadRequest("the guest is stopping")
        ex = self._launch(job_id, tool, args, req)
        return await self._answer(ex, 0, 0, wait_s, attached=False)

    async def poll(self, job_id: str, out_off: int, err_off: int, wait_s: float) -> bytes | None:
        ex = self._live.get(job_id) or self._recorded(job_id)
        if ex is None:
            return None
        return await self._answer(ex, out_off, err_off, self._wait(wait_s), attached=True)

    async def cancel(self, job_id: str, sig: int, grace_s: float) -> bytes | None:
        ex = self._live.get(job_id) or self._recorded(job_id)
        if ex is None:
            return None
        if ex.running and ex.ctx is not None and ex.ctx.canceller is not None:
            ex.ctx.canceller(sig, grace_s)
        return await self._answer(ex, 0, 0, 0.0, attached=True)

    def list(self) -> list[dict[str, Any]]:
        return [e.summary_dict() for e in self.journal.entries.values()]

    # ---- internals -------------------------------------------------------------------------
    @staticmethod
    def _wait(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise BadRequest("wait_s must be a number >= 0")
        return min(float(value), MAX_WAIT_S)

    def _recorded(self, job_id: str) -> Execution | None:
        entry = self.journal.entries.get(job_id)
        if entry is None:
            return None
        result_json = compact_json(self.journal.load_result(job_id))
        return Execution(entry, None, BoundedOutput(0), BoundedOutput(0), result_json)

    def _launch(self, job_id: str, tool: str, args: dict[str, Any], req: dict[str, Any]) -> Execution:
        limits = _limits(req.get("limits"))
        env = req.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise BadRequest("env must be an object of string values")
        skills_dir = req.get("skills_dir") or self.skills_dir
        if not isinstance(skills_dir, str):
            raise BadRequest("skills_dir must be a string")
        # The entry goes in before the first await: a concurrent duplicate start attaches to it.
        entry = self.journal.record_start(job_id, tool, _summary(tool, args))
        out_max = int(limits["output_max_bytes"])
        ex = Execution(entry, None, BoundedOutput(out_max), BoundedOutput(out_max))
        ex.ctx = ToolContext(
            job_id=job_id,
            paths=self._paths.with_read_only((skills_dir,)),
            limits=limits,
            env=env,
            skills_dir=skills_dir,
            state_dir=self.state_dir,
            processes=self.processes,
            stdout=ex.stdout,
            stderr=ex.stderr,
            notify=ex.wake,
        )
        self._live[job_id] = ex
        self._running += 1
        outcome = self._call(ex.ctx, tool, args)
        if isinstance(outcome, dict):
            self._finish(ex, outcome)  # done already: answered without a task or a loop iteration
        else:
            ex.task = asyncio.create_task(self._finish_later(ex, outcome))
        return ex

    @staticmethod
    def _call(ctx: ToolContext, tool: str, args: dict[str, Any]) -> Result | Awaitable[Result]:
        """Run the tool as far as it goes without waiting: its result, or an awaitable of it."""
        run = TOOLS.get(tool)
        try:
            if run is None:
                raise ToolError(f"unsupported tool '{tool}'")
            return run(ctx, args)
        except Exception as err:  # a bug in a tool must still end the execution with an answer
            return _failure(tool, ctx.job_id, err)

    async def _finish_later(self, ex: Execution, pending: Awaitable[Result]) -> None:
        try:
            result = await pending
        except Exception as err:
            result = _failure(ex.entry.tool, ex.entry.job_id, err)
        self._finish(ex, result)

    def _finish(self, ex: Execution, result: Result) -> None:
        state = ExecutionState.finished
        if self.stopping:
            state, result = ExecutionState.interrupted, interrupted_result(result)
        ex.result_json = self.journal.record_end(ex.entry.job_id, state, result)
        ex.wake()
        self._forget_old(ex.entry.job_id)

    def _forget_old(self, job_id: str) -> None:
        """Move the finished job to the end of the LRU and drop the oldest finished beyond RECENT."""
        self._running -= 1
        self._live.move_to_end(job_id)
        excess = len(self._live) - self._running - RECENT
        if excess <= 0:
            return
        # Oldest first, stopping as soon as enough are found: usually just the very first entry.
        stale: list[str] = []
        for old, ex in self._live.items():
            if not ex.running:
                stale.append(old)
                if len(stale) == excess:
                    break
        for old in stale:
            del self._live[old]

    async def _wait_for_news(self, ex: Execution, out_off: int, err_off: int, wait_s: float) -> None:
        began = time.monotonic()
        deadline = began + wait_s
        while ex.running:
            now = time.monotonic()
            remaining = deadline - now
            pending = ex.pending(out_off, err_off)
            if pending >= POLL_CHUNK_BYTES:
                return
            if pending:
                remaining = min(remaining, began + COALESCE_S - now)
            if remaining <= 0 or not await ex.changed_within(remaining):
                return

    async def _answer(
        self, ex: Execution, out_off: int, err_off: int, wait_s: float, attached: bool
    ) -> bytes:
        """The ExecutionView as JSON, its result spliced in as the journal recorded it (no second
        encoding of what may be the largest part of the answer)."""
        if wait_s > 0 and ex.running:
            await self._wait_for_news(ex, out_off, err_off, wait_s)
        final = not ex.running
        stdout, next_out, out_skipped = _read(ex.stdout, out_off, final)
        stderr, next_err, err_skipped = _read(ex.stderr, err_off, final)
        view = compact_json(
            {
                "job_id": ex.entry.job_id,
                "tool": ex.entry.tool,
                "state": str(ex.entry.state),
                "attached": attached,
                "started_at": ex.entry.started_at,
                "finished_at": ex.entry.finished_at,
                "stdout": stdout,
                "stderr": stderr,
                "stdout_offset": next_out,
                "stderr_offset": next_err,
                "stdout_skipped": out_skipped,
                "stderr_skipped": err_skipped,
                "more_output": next_out < ex.stdout.total or next_err < ex.stderr.total,
            }
        )
        result = ex.result_json if final and ex.result_json is not None else b"null"
        return b"%s,\"result\":%s}" % (view[:-1], result)

    async def stop(self) -> None:
        """Guest shutdown: kill running commands; their executions end as interrupted."""
        self.stopping = True
        running = [ex for ex in self._live.values() if ex.running]
        for ex in running:
            if ex.ctx is not None and ex.ctx.canceller is not None:
                ex.ctx.canceller(15, STOP_GRACE_S)
        tasks = [ex.task for ex in running if ex.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_S + 2)
            for task in pending:
                task.cancel()
