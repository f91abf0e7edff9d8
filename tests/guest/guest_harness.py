"""Test harness: a real guest process (`python -m guest --uds ...`), clients, one-call helper."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.guest_client import GuestClient, GuestUnavailable
from common.guest_protocol import GuestAddress

SKILLS_DIR = str(Path(__file__).parent / "skills")
ACTOR = "s-session-1-0123456789abcde"
REPO = Path(__file__).resolve().parents[2]

_job_ids = itertools.count(1)


@dataclass
class GuestProc:
    """One guest process over fixed workspace/state dirs; can be killed and started again."""

    tmp: Path
    max_processes: int = 16
    #: The actor its launcher names (`--actor`); None: bound by the first request.
    actor: str | None = None
    #: Interpreter options before `-m guest` (`-W error::DeprecationWarning`, say).
    python_flags: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def workspace(self) -> Path:
        return self.tmp / "ws"

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def socket(self) -> str:
        return str(self.tmp / "guest.sock")

    async def start(self) -> None:
        cmd = [
            sys.executable,
            *self.python_flags,
            "-m",
            "guest",
            "--uds",
            self.socket,
            "--workspace",
            str(self.workspace),
            "--state-dir",
            str(self.state_dir),
            "--skills-dir",
            SKILLS_DIR,
            "--max-processes",
            str(self.max_processes),
            *(["--actor", self.actor] if self.actor else []),
        ]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stderr=open(self.tmp / "guest.log", "ab"))
        async with GuestClient(GuestAddress(uds=self.socket)) as client:
            for _ in range(200):
                try:
                    info = await client.readyz()
                    if info["pid"] == self.proc.pid:
                        return
                except GuestUnavailable:
                    pass
                await asyncio.sleep(0.025)
        raise RuntimeError("guest did not become ready")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)

    def client(self, actor: str = ACTOR) -> GuestClient:
        return GuestClient(GuestAddress(uds=self.socket), actor=actor)


def new_job_id() -> str:
    return f"job-{os.getpid()}-{next(_job_ids)}"


async def call(
    client: GuestClient,
    tool: str,
    limits: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    **arguments: Any,
) -> dict[str, Any]:
    """Run one tool call to completion and return its result."""
    result, view = await client.run(new_job_id(), tool, arguments, limits=limits, env=env)  # type: ignore[arg-type]
    assert view["state"] == "finished"
    return dict(result)


async def wait_process_gone(pid: int) -> None:
    """Wait until `pid` has exited (gone, or a zombie awaiting its parent); fail after 5 s."""
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"process {pid} still alive")
