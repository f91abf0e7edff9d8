"""Starting the guest in a slot's sandbox and waiting for /readyz.

The guest cannot be replaced from inside: the interpreter runs isolated (`-I`: no cwd, script
dir or user site on sys.path, no PYTHON* variables) and imports our code only from the read-only
/opt/atefleet; the listening socket is bound here, outside the sandbox, at a path of this
incarnation (`Layout.socket(slot, run_id)`) and handed in as an open fd, so nothing inside can
remove or re-point it; and the actor it serves is given on its command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from pathlib import Path

from common.config import TemplateConfig
from local_substrate.cgroups import Cgroups
from local_substrate.layout import Layout
from local_substrate.sandbox import SandboxProcess, SandboxSpec, python_executable, start_sandbox, view
from local_substrate.slots import SlotDirs
from local_substrate.zygote import Zygote, ZygoteError, start_zygote_guest

log = logging.getLogger(__name__)

#: Seconds a guest may take from spawn to a 200 on /readyz.
READY_TIMEOUT_S = 30.0
#: Pause between readiness probes. The socket listens from the start (bound here), so a probe
#: waits in its backlog until the guest answers; this pause only follows a probe the guest
#: could not answer.
READY_POLL_S = 0.005
#: Interpreter flags: isolated mode, no site import (its third-party packages are put on
#: sys.path by GUEST_BOOT; no site also saves ~15 ms per resume).
PYTHON_FLAGS = ("-I", "-S")
#: Program run by `python -I -S -c`: our code's dirs first on sys.path, then `python -m guest`.
#: `ssl` is made unimportable first: the guest speaks plain HTTP on a unix socket, and asyncio
#: imports ssl when it can (loading OpenSSL, a large part of `import asyncio` in every cold start).
#: The tenant's own commands are other processes and keep it.
GUEST_BOOT = (
    "import sys; sys.modules['ssl'] = None; sys.path[:0] = {path!r}; import runpy; "
    "runpy.run_module('guest', run_name='__main__', alter_sys=True)"
)


class GuestStartError(Exception):
    pass


def sandbox_spec(
    layout: Layout,
    cgroups: Cgroups,
    name: str,
    dirs: SlotDirs,
    template: TemplateConfig,
    skills: tuple[tuple[Path, str], ...],
) -> SandboxSpec:
    lim = template.limits
    return SandboxSpec(
        hostname=name[:63],
        workspace=dirs.workspace,
        state=dirs.state,
        tmp=dirs.tmp,
        root=dirs.root,
        etc=layout.sandbox_etc,
        skills=skills,
        network=template.network,
        limits=lim,
        uid=dirs.uid,
        cgroup=cgroups.make(dirs.base.name, lim.memory_mb, lim.max_pids),
        log_path=layout.logs / f"{dirs.base.name}.log",
    )


def guest_args(level: str, spec: SandboxSpec, actor: str) -> list[str]:
    """The guest's options but its socket's."""
    v = view(level, spec)
    args = ["--actor", actor, "--workspace", v.workspace, "--state-dir", v.state]
    return args + (["--skills-dir", v.skills[0]] if v.skills else [])


def guest_command(level: str, spec: SandboxSpec, actor: str, listen_fd: int) -> list[str]:
    """The guest's argv; `listen_fd` is its listening socket, open at that number in the sandbox."""
    boot = GUEST_BOOT.format(path=list(view(level, spec).code_path))
    args = ["--fd", str(listen_fd), *guest_args(level, spec, actor)]
    return [python_executable(), *PYTHON_FLAGS, "-c", boot, *args]


def listen_socket(path: Path) -> socket.socket:
    """Bind the guest's socket on the host side; its dir is the fleet's, never a sandbox's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


async def _ready_once(sock: Path, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(str(sock))
    except (OSError, TimeoutError):
        return False
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n\r\n")
            await writer.drain()
            status = await reader.readline()
        return status.split(b" ")[1:2] == [b"200"]
    except (OSError, IndexError, TimeoutError):
        return False
    finally:
        writer.close()


async def wait_ready(process: SandboxProcess, sock: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the guest answers 200 on /readyz; GuestStartError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.proc.returncode is not None:
            raise GuestStartError(f"guest exited with {process.proc.returncode} before it was ready")
        if await _ready_once(sock, max(0.0, deadline - time.monotonic())):
            return
        await asyncio.sleep(READY_POLL_S)
    raise GuestStartError(f"guest not ready after {timeout_s:.0f} s")


async def _from_zygote(zygote: Zygote, spec: SandboxSpec, actor: str, fd: int) -> SandboxProcess | None:
    """The guest forked from the zygote; None (logged) when the zygote failed: then it is run."""
    try:
        return await start_zygote_guest(zygote, spec, guest_args("bwrap", spec, actor), fd)
    except ZygoteError as e:
        log.warning("guest of %s: the zygote failed (%s); starting its own interpreter", actor, e)
        return None


async def start_guest(
    level: str, spec: SandboxSpec, actor: str, sock_path: Path, zygote: Zygote | None = None
) -> SandboxProcess:
    """Start the guest of `actor` in a sandbox, serving on `sock_path`; returns once it serves,
    kills it on failure. With a `zygote` (bwrap only), forked from it rather than run."""
    listener = listen_socket(sock_path)
    try:
        # Our copy is closed once spawned: when the guest exits, connecting is refused instead of
        # queueing on a socket nobody serves.
        with contextlib.closing(listener):
            fd = listener.fileno()
            process = await _from_zygote(zygote, spec, actor, fd) if zygote is not None else None
            if process is None:
                process = await start_sandbox(level, spec, guest_command(level, spec, actor, fd), (fd,))
    except BaseException:
        sock_path.unlink(missing_ok=True)
        raise
    try:
        await wait_ready(process, sock_path)
    except BaseException:
        await process.reap()
        sock_path.unlink(missing_ok=True)
        raise
    return process
