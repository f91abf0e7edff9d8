"""process: manage background processes (status, logs by byte offset, signal/kill, list, write_stdin).

`logs` returns at most `limit` bytes of each stream after the given offsets and the next
offsets; with `wait` (≤ MAX_WAIT_S) it waits for new output or the process's exit first.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
from collections.abc import Awaitable, Callable
from typing import Any

from common.guest_protocol import MAX_WAIT_S
from guest.output import utf8_safe_end
from guest.procs import BackgroundProcess
from guest.spawn import parse_signal
from guest.tools.base import Result, ToolContext, ToolError, arg_bool, arg_float, arg_int, arg_str

#: Default and largest page of `logs`, per stream.
LOG_PAGE_BYTES = 64 << 10
LOG_PAGE_MAX_BYTES = 1 << 20


def _status_text(info: dict[str, Any]) -> str:
    state = info["status"]
    if state == "exited":
        state += f" (exit code {info['exit_code']})"
    return (
        f"{info['process_id']} pid {info['pid']}: {state}; stdout {info['stdout_bytes']} bytes, "
        f"stderr {info['stderr_bytes']} bytes; command: {info['command']}"
    )


async def _status(ctx: ToolContext, bp: BackgroundProcess, args: dict[str, Any]) -> Result:
    info = bp.record.info()
    return {"output": _status_text(info), **info}


def _read(bp: BackgroundProcess, stream: str, offset: int, limit: int, final: bool) -> tuple[str, int]:
    try:
        with open(bp.log_path(stream), "rb") as f:
            data = os.pread(f.fileno(), limit, offset)
    except FileNotFoundError:
        data = b""
    if not final and len(data) == limit:
        data = data[: utf8_safe_end(data)]
    return data.decode("utf-8", errors="replace"), offset + len(data)


def _has_news(bp: BackgroundProcess, out_off: int, err_off: int) -> bool:
    r = bp.record
    return r.status != "running" or r.stdout_bytes > out_off or r.stderr_bytes > err_off


async def _logs(ctx: ToolContext, bp: BackgroundProcess, args: dict[str, Any]) -> Result:
    out_off = arg_int(args, "stdout_offset", default=0, minimum=0) or 0
    err_off = arg_int(args, "stderr_offset", default=0, minimum=0) or 0
    limit = arg_int(args, "limit", default=LOG_PAGE_BYTES, minimum=1) or LOG_PAGE_BYTES
    if limit > LOG_PAGE_MAX_BYTES:
        raise ToolError(f"'limit' must be <= {LOG_PAGE_MAX_BYTES}")
    wait = min(arg_float(args, "wait", 0.0) or 0.0, MAX_WAIT_S)
    if wait and not _has_news(bp, out_off, err_off):
        try:
            await asyncio.wait_for(bp.changed.wait(), wait)
        except TimeoutError:
            pass
    final = bp.record.status != "running"
    stdout, next_out = _read(bp, "stdout", out_off, limit, final)
    stderr, next_err = _read(bp, "stderr", err_off, limit, final)
    info = bp.record.info()
    text = stdout + (f"\n[stderr]\n{stderr}" if stderr else "")
    return {
        **info,
        "output": text,
        "stdout": stdout,
        "stderr": stderr,
        "stdout_offset": next_out,
        "stderr_offset": next_err,
        "more": next_out < info["stdout_bytes"] or next_err < info["stderr_bytes"],
    }


async def _signal_action(ctx: ToolContext, bp: BackgroundProcess, args: dict[str, Any]) -> Result:
    try:
        sig = parse_signal(args.get("signal"))
    except ValueError as err:
        raise ToolError(f"'signal': {err}") from None
    return await _send(ctx, bp, sig)


async def _kill(ctx: ToolContext, bp: BackgroundProcess, args: dict[str, Any]) -> Result:
    return await _send(ctx, bp, _signal.SIGKILL)


async def _send(ctx: ToolContext, bp: BackgroundProcess, sig: int) -> Result:
    delivered = ctx.processes.send_signal(bp, sig)
    name = _signal.Signals(sig).name
    text = f"Sent {name} to {bp.record.process_id}" if delivered else f"{bp.record.process_id} is not running"
    return {"output": text, "delivered": delivered, "signal": sig, **{"process_id": bp.record.process_id}}


async def _write_stdin(ctx: ToolContext, bp: BackgroundProcess, args: dict[str, Any]) -> Result:
    data = arg_str(args, "data")
    eof = arg_bool(args, "eof")
    stdin = bp.proc.stdin if bp.proc is not None else None
    if stdin is None or bp.record.status != "running" or stdin.is_closing():
        raise ToolError(f"{bp.record.process_id}: stdin is not open (process not running or detached)")
    try:
        stdin.write(data.encode())
        await stdin.drain()
        if eof:
            stdin.close()
    except (BrokenPipeError, ConnectionResetError) as err:
        raise ToolError(f"{bp.record.process_id}: stdin closed by the process") from err
    return {
        "output": f"Wrote {len(data.encode())} bytes to {bp.record.process_id}",
        "bytes_written": len(data.encode()),
    }


_ACTIONS: dict[str, Callable[[ToolContext, BackgroundProcess, dict[str, Any]], Awaitable[Result]]] = {
    "status": _status,
    "logs": _logs,
    "signal": _signal_action,
    "kill": _kill,
    "write_stdin": _write_stdin,
}


async def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    action = arg_str(args, "action", required=True)
    if action == "list":
        procs = ctx.processes.list()
        text = "\n".join(_status_text(p) for p in procs) or "No background processes."
        return {"output": text, "processes": procs}
    if action not in _ACTIONS:
        raise ToolError(f"'action' must be one of list, {', '.join(_ACTIONS)}")
    return await _ACTIONS[action](ctx, ctx.processes.get(args.get("process_id")), args)
