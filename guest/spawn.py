"""Starting `sh -c` commands: the base environment, process groups, signals, exit statuses.

Every command runs in its own session (process group), so a timeout or cancel reaches all of
its children. The environment is a minimal base plus the per-call variables: the guest's own
environment never leaks into commands.
"""

from __future__ import annotations

import asyncio
import os
import signal as _signal
from typing import Any

#: PATH used when the guest itself was started without one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seconds between SIGTERM and SIGKILL when a process group is stopped.
KILL_GRACE_S = 2.0


def base_env(workspace: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": workspace,
        "LANG": "C.UTF-8",
        "SHELL": "/bin/sh",
        "TERM": "dumb",
    }


def command_env(workspace: str, cwd: str, extra: dict[str, str]) -> dict[str, str]:
    env = base_env(workspace)
    env["PWD"] = cwd
    env.update(extra)
    return env


async def spawn_shell(command: str, cwd: str, env: dict[str, str], stdin: bool) -> asyncio.subprocess.Process:
    """`sh -c command` in a new session, stdout/stderr piped, stdin piped or /dev/null."""
    kwargs: dict[str, Any] = {
        "stdin": asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        "stdout": asyncio.subprocess.PIPE,
        "stderr": asyncio.subprocess.PIPE,
        "cwd": cwd,
        "env": env,
        "start_new_session": True,
    }
    return await asyncio.create_subprocess_exec("/bin/sh", "-c", command, **kwargs)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by `pid`; False when it is already gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def parse_signal(value: object, default: int = _signal.SIGTERM) -> int:
    """ "SIGTERM", "TERM", "15" or 15 → 15; ValueError on anything else."""
    if value is None:
        return int(default)
    if isinstance(value, int) and not isinstance(value, bool):
        sig = value
    elif isinstance(value, str) and value.isdigit():
        sig = int(value)
    elif isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            sig = int(_signal.Signals[name])
        except KeyError:
            raise ValueError(f"unknown signal {value!r}") from None
    else:
        raise ValueError(f"unknown signal {value!r}")
    if sig not in {int(s) for s in _signal.Signals}:
        raise ValueError(f"unknown signal {value!r}")
    return sig


def exit_status(returncode: int) -> tuple[int, int | None]:
    """(exit_code, signal): a process killed by signal N reports exit code 128+N, as shells do."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


async def stop_group(
    proc: asyncio.subprocess.Process, sig: int = _signal.SIGTERM, grace_s: float = KILL_GRACE_S
) -> None:
    """Signal the group, then SIGKILL it if the leader has not exited within `grace_s`."""
    if not signal_group(proc.pid, sig):
        return
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        pass
    # Children may outlive the leader; the whole group goes.
    signal_group(proc.pid, _signal.SIGKILL)
