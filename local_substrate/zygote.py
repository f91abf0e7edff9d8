"""The server's side of the guest zygote (guest/zygote.py): its process, and starting a guest
through it in a bwrap sandbox whose command is a waiter.

A start: bwrap runs the waiter (after setpriv and prlimit, like any command), which writes one
byte on a pipe once it runs, so the sandbox is complete (mounts, root, namespaces); a pidfd of the
waiter then goes to the zygote with the guest's listening socket, its log and the write end of the
pipe the waiter blocks on; the zygote's reply is the guest's pid and a pidfd of it. Everything
else about the sandbox (stopping, killing, freezing, seeing it end) works on bwrap as before, plus
the guest's own process tree (`SandboxProcess.guest`).

The zygote is started with the server and again after it died; a start it fails is a failed guest
start, like a guest that exits before it is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from common.zygote_protocol import NAMESPACES
from local_substrate.sandbox import (
    LAUNCH_ENV,
    OOM_SCORE_ADJ,
    SandboxProcess,
    SandboxSpec,
    children,
    code_moves,
    environment,
    host_code_path,
    python_executable,
    readable,
    rlimits,
    start_sandbox,
    view,
)

log = logging.getLogger(__name__)

#: How the zygote starts: the collector off before anything is imported (guest/zygote.py,
#: `serve`), our code from the host's paths (not the sandbox's), then its loop. The paths come in
#: its environment, not its argv: every guest shows the zygote's argv to the tenant.
CODE_PATH_ENV = "ATEFLEET_CODE_PATH"
ZYGOTE_BOOT = (
    "import gc; gc.disable(); import os, sys; sys.modules['ssl'] = None; "
    f"sys.path[:0] = os.environ['{CODE_PATH_ENV}'].split(':'); import guest.zygote; guest.zygote.main()"
)
#: Seconds a sandbox's waiter may take to run, and the zygote to answer.
READY_TIMEOUT_S = 30.0
#: The waiter: says it runs (the sandbox is complete), then reads until the guest is gone. Its
#: fds are named through /proc: dash's redirections take only fds 0-9.
WAITER = "printf x > /proc/self/fd/{ready} && exec cat /proc/self/fd/{death}"


class ZygoteError(Exception):
    """The zygote could not start a guest (its reason), or is gone."""


class Zygote:
    """One zygote process and the requests to it, one at a time."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._process: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The zygote's pid while it runs."""
        running = self._process is not None and self._process.returncode is None
        return self._process.pid if running and self._process is not None else None

    async def start(self) -> None:
        """Start it ahead of the first guest: its imports then overlap whatever comes before."""
        async with self._lock:
            await self._started()

    async def _started(self) -> socket.socket:
        if self._sock is not None and self.pid is not None:
            return self._sock
        await self._close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs, open(self.log_path, "ab") as out:
            self._process = await asyncio.create_subprocess_exec(
                python_executable(), "-I", "-S", "-c", ZYGOTE_BOOT, str(theirs.fileno()),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                env={**LAUNCH_ENV, CODE_PATH_ENV: ":".join(host_code_path())},
                pass_fds=(theirs.fileno(),), start_new_session=True,
            )  # fmt: skip
        ours.setblocking(False)
        self._sock = ours
        return ours

    async def spawn(self, request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """The guest's host pid and a pidfd of it."""
        async with self._lock:
            sock = await self._started()
            try:
                # Small: the socket's buffer always takes it, and no second one is sent before
                # the first's reply.
                socket.send_fds(sock, [json.dumps(request).encode()], fds)
                reply, got = await asyncio.wait_for(_receive(sock), READY_TIMEOUT_S)
            except (OSError, TimeoutError) as e:
                await self._close()
                raise ZygoteError(f"the guest zygote did not answer: {e}") from e
        if "pid" not in reply or len(got) != 1:
            for fd in got:
                os.close(fd)
            raise ZygoteError(reply.get("error", f"the guest zygote answered {reply!r}"))
        return int(reply["pid"]), got[0]

    async def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the zygote reads its end and exits
            self._sock = None
        if self._process is not None:
            if self._process.returncode is None:
                try:
                    await asyncio.wait_for(self._process.wait(), 2.0)
                except TimeoutError:
                    self._process.kill()
                    await self._process.wait()
            self._process = None

    async def close(self) -> None:
        async with self._lock:
            await self._close()


async def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 65536, 1)
        except BlockingIOError:
            await readable(sock)
            continue
        if not message:
            raise OSError("the guest zygote exited")
        return json.loads(message), fds


async def start_zygote_guest(
    zygote: Zygote, spec: SandboxSpec, argv: list[str], listen_fd: int
) -> SandboxProcess:
    """Start a bwrap sandbox running the waiter, then the guest in it through the zygote; `argv`
    is the guest's command line without `--fd`."""
    ready_r, ready_w = os.pipe()
    death_r, death_w = os.pipe()
    opened = [ready_r, ready_w, death_r, death_w]
    process: SandboxProcess | None = None
    try:
        if os.geteuid() == 0:  # the waiter runs as the slot's uid and reopens its ends
            for fd in (ready_w, death_r):
                os.fchown(fd, spec.uid, spec.uid)
        waiter = ["sh", "-c", WAITER.format(ready=ready_w, death=death_r)]
        process = await start_sandbox("bwrap", spec, waiter, (ready_w, death_r))
        for fd in (ready_w, death_r):
            os.close(fd)
            opened.remove(fd)
        await asyncio.wait_for(readable(ready_r), READY_TIMEOUT_S)
        if os.read(ready_r, 1) != b"x":
            raise ZygoteError("the sandbox's waiter did not start")
        init = children(process.pid)
        waiters = children(init[0]) if init else []
        if not waiters:
            raise ZygoteError("the sandbox's waiter is gone")
        pidfd = os.pidfd_open(waiters[0])
        opened.append(pidfd)
        root = os.stat(f"/proc/{waiters[0]}/root")
        namespaces = {name: os.stat(f"/proc/{waiters[0]}/ns/{name}").st_ino for name in NAMESPACES}
        log_fd = os.open(spec.log_path, os.O_WRONLY | os.O_APPEND)
        opened.append(log_fd)
        v = view("bwrap", spec)
        request = {
            # (the forked child reads the waiter's namespaces itself, the guest checks they are
            # these: two looks, so one that saw a process other than the waiter is caught)
            "waiter_pid": waiters[0], "root": [root.st_dev, root.st_ino], "namespaces": namespaces,
            "cwd": v.workspace,
            "env": environment(v), "argv": argv, "uid": spec.uid if os.geteuid() == 0 else None,
            "rlimits": rlimits(spec.limits), "oom_score_adj": OOM_SCORE_ADJ,
            "cgroup_procs": spec.cgroup.procs_files if spec.cgroup else [], "moves": code_moves(),
        }  # fmt: skip
        process.guest = await zygote.spawn(request, [pidfd, listen_fd, log_fd, death_w])
        return process
    except BaseException:
        if process is not None:
            await process.reap()
        raise
    finally:
        for fd in opened:
            os.close(fd)
