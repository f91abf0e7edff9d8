"""Starting the guest (`python -m guest --uds ...`) in a slot's sandbox and waiting for /readyz."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from common.config import TemplateConfig
from local_substrate.cgroups import Cgroups
from local_substrate.layout import Layout
from local_substrate.sandbox import SandboxProcess, SandboxSpec, python_executable, start_sandbox, view
from local_substrate.slots import SlotDirs

#: Seconds a guest may take from spawn to a 200 on /readyz.
READY_TIMEOUT_S = 30.0
#: Pause between readiness probes. The guest announces readiness only by answering, so this
#: polls; 5 ms keeps the added resume latency small.
READY_POLL_S = 0.005
#: Socket file name inside a slot's socket dir.
SOCKET_NAME = "guest.sock"


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
        sock_dir=dirs.sock_dir,
        root=dirs.root,
        skills=skills,
        network=template.network,
        limits=lim,
        uid=dirs.uid,
        cgroup=cgroups.make(dirs.base.name, lim.memory_mb, lim.max_pids),
        log_path=layout.logs / f"{dirs.base.name}.log",
    )


def guest_command(level: str, spec: SandboxSpec) -> list[str]:
    v = view(level, spec)
    cmd = [
        python_executable(),
        "-S",
        "-m",
        "guest",
        "--uds",
        f"{v.sock_dir}/{SOCKET_NAME}",
        "--workspace",
        v.workspace,
    ]
    cmd += ["--state-dir", v.state]
    if v.skills:
        cmd += ["--skills-dir", v.skills[0]]
    return cmd


async def _ready_once(sock: Path) -> bool:
    try:
        reader, writer = await asyncio.open_unix_connection(str(sock))
    except OSError:
        return False
    try:
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status = await reader.readline()
        return status.split(b" ")[1:2] == [b"200"]
    except (OSError, IndexError):
        return False
    finally:
        writer.close()


async def wait_ready(process: SandboxProcess, sock: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the guest answers 200 on /readyz; GuestStartError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.proc.returncode is not None:
            raise GuestStartError(f"guest exited with {process.proc.returncode} before it was ready")
        if sock.exists() and await _ready_once(sock):
            return
        await asyncio.sleep(READY_POLL_S)
    raise GuestStartError(f"guest not ready after {timeout_s:.0f} s")


async def start_guest(level: str, spec: SandboxSpec) -> SandboxProcess:
    """Start the guest in a sandbox and return once it serves; kills it on failure."""
    process = await start_sandbox(level, spec, guest_command(level, spec))
    try:
        await wait_ready(process, spec.sock_dir / SOCKET_NAME)
    except BaseException:
        process.kill()
        await process.proc.wait()
        raise
    return process
