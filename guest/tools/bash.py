"""The bash tool: `sh -c` in its own process group, bounded output, timeout, background mode.

Seed-compatible `output` (what the seed's HTTP API answered): on exit code 0 the stdout text
followed by the stderr text; otherwise `Error: exit code N: <stderr> (stdout: <stdout>)`, the
seed's own format; on timeout `Error: timed out after Ns (process group killed): ...`.
The structured fields carry each stream apart, exactly.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from typing import Any

from guest.output import BoundedOutput
from guest.spawn import ShellProcess, Sink, command_env, exit_status, expose_session_token, stop_group
from guest.tools.base import (
    Result,
    ToolContext,
    ToolError,
    arg_bool,
    arg_float,
    arg_opt_str,
    limit_error,
)

#: After the shell exits, how long its children may keep the pipes open before we stop reading.
PIPE_DRAIN_S = 0.5


def _command(args: dict[str, Any]) -> str:
    for name in ("command", "cmd", "code"):
        value = arg_opt_str(args, name)
        if value:
            return value
    raise ToolError("'command' argument is required")


def _env(ctx: ToolContext, args: dict[str, Any], cwd: str) -> dict[str, str]:
    extra = args.get("env") or {}
    if not isinstance(extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise ToolError("'env' must be an object of string values")
    env = command_env(ctx.paths.root, cwd, {**extra, **ctx.env})
    expose_session_token(ctx.state_dir, env)
    return env


def _timeout(ctx: ToolContext, args: dict[str, Any]) -> float:
    timeout = arg_float(args, "timeout")
    if timeout is None:
        return float(ctx.limits["timeout_default_s"])
    if timeout <= 0:
        raise ToolError("'timeout' must be > 0")
    if timeout > ctx.limits["timeout_max_s"]:
        raise limit_error("timeout_max_s", ctx.limits["timeout_max_s"], f"timeout {timeout:g}s")
    return timeout


def _cwd(ctx: ToolContext, args: dict[str, Any]) -> str:
    if args.get("cwd") in (None, ""):
        return ctx.paths.root
    cwd = ctx.paths.resolve(args["cwd"], "cwd", write=True)
    if not os.path.isdir(cwd):
        raise ToolError(f"cwd {args['cwd']!r} is not a directory")
    return cwd


def run(ctx: ToolContext, args: dict[str, Any]) -> Awaitable[Result]:
    """Check the arguments and start a foreground command at once; the awaitable waits for it."""
    command = _command(args)
    cwd = _cwd(ctx, args)
    env = _env(ctx, args, cwd)
    stdin = arg_opt_str(args, "stdin")
    if arg_bool(args, "background"):
        return _background(ctx, command, cwd, env, stdin)
    timeout = _timeout(ctx, args)
    started = time.monotonic()
    proc = _spawn(ctx, command, cwd, env, stdin)
    stoppers: list[asyncio.Task[None]] = []

    def cancel(sig: int, grace_s: float) -> None:
        stoppers.append(asyncio.create_task(stop_group(proc, sig, grace_s)))

    # Set before the first await: a cancel (or a guest stop) reaches the command from its start.
    ctx.canceller = cancel
    return _supervise(ctx, proc, stoppers, timeout, started)


async def _background(
    ctx: ToolContext, command: str, cwd: str, env: dict[str, str], stdin: str | None
) -> Result:
    record = await ctx.processes.start(command, cwd, env, ctx.job_id)
    bp = ctx.processes.get(record.process_id)
    if stdin and bp.proc is not None and bp.proc.stdin is not None:
        bp.proc.stdin.write(stdin.encode())
    return {
        "output": f"Started background process {record.process_id} (pid {record.pid}); "
        "use the process tool to read its logs.",
        "process_id": record.process_id,
        "pid": record.pid,
    }


def _sink(out: BoundedOutput, ctx: ToolContext) -> Sink:
    def write(chunk: bytes) -> None:
        out.write(chunk)
        ctx.notify()

    return write


def _spawn(ctx: ToolContext, command: str, cwd: str, env: dict[str, str], stdin: str | None) -> ShellProcess:
    """Start the command; it counts against max_processes until `_supervise` ends."""
    ctx.processes.check_capacity()
    try:
        proc = ShellProcess.start(
            command,
            cwd,
            env,
            stdin.encode() if stdin is not None else None,
            (_sink(ctx.stdout, ctx), _sink(ctx.stderr, ctx)),
        )
    except OSError as err:
        raise ToolError(f"cannot start sh: {err}") from err
    ctx.processes.foreground += 1
    return proc


async def _supervise(
    ctx: ToolContext, proc: ShellProcess, stoppers: list[asyncio.Task[None]], timeout: float, started: float
) -> Result:
    try:
        timed_out = False
        returncode = await proc.wait_until(timeout)
        if returncode is None:
            timed_out = True
            await stop_group(proc)
            returncode = await proc.wait()
        await proc.drain(PIPE_DRAIN_S)
        if stoppers:
            await asyncio.gather(*stoppers, return_exceptions=True)
        ctx.canceller = None
        elapsed_s = time.monotonic() - started
        return _result(ctx, returncode, timed_out, bool(stoppers), elapsed_s, timeout)
    finally:
        proc.close()
        ctx.processes.foreground -= 1


def _result(
    ctx: ToolContext, returncode: int, timed_out: bool, cancelled: bool, elapsed_s: float, timeout: float
) -> Result:
    exit_code, sig = exit_status(returncode)
    stdout, stderr = ctx.stdout.text(), ctx.stderr.text()
    result: Result = {
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": exit_code,
        "signal": sig,
        "timed_out": timed_out,
        "cancelled": cancelled,
        "truncated": bool(ctx.stdout.dropped or ctx.stderr.dropped),
        "stdout_bytes_dropped": ctx.stdout.dropped,
        "stderr_bytes_dropped": ctx.stderr.dropped,
        "duration_ms": round(elapsed_s * 1000, 3),
    }
    if timed_out:
        result["error"] = f"timed out after {timeout:g}s (process group killed)"
    elif exit_code != 0:
        result["error"] = f"exit code {exit_code}"
    if "error" in result:
        result["is_error"] = True
        result["output"] = f"Error: {result['error']}: {stderr} (stdout: {stdout})"
    else:
        result["output"] = stdout + stderr
    return result
