"""Sandbox isolation, for each level (bwrap and unshare), checked with commands run the way an
agent's commands run: through the real guest's bash tool inside the actor."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from common.embedded_redis import EmbeddedRedis
from common.substrate import Actor, ActorStatus
from tests.substrate.conftest import ATESPACE, Harness, Start

LEVELS = ["bwrap", "unshare"]
LIMITED = {"name": "default-env-template", "limits": {"memory_mb": 256, "max_pids": 64}}


async def _two_actors(start_substrate: Start, level: str) -> tuple[Harness, Actor, Actor]:
    h = await start_substrate(slots=2, sandbox=level, templates=[LIMITED])
    assert h.server.level == level
    await h.actor("a")
    await h.actor("b")
    a = await h.client.resume_actor(ATESPACE, "a")
    b = await h.client.resume_actor(ATESPACE, "b")
    return h, a, b


def _absent(paths: list[Path | str]) -> str:
    return "; ".join(f"if test -e {p}; then echo VISIBLE {p}; fi" for p in paths)


@pytest.mark.parametrize("level", LEVELS)
async def test_fleet_state_and_other_sessions_are_invisible(
    start_substrate: Start, level: str, redis_server: EmbeddedRedis, repo_root: Path
) -> None:
    h, a, b = await _two_actors(start_substrate, level)
    await h.bash(a, "echo secret-a > mine.txt")
    slot_a = h.server.layout.slot_dir(a.pod_name)
    hidden = [
        slot_a / "workspace" / "mine.txt",  # the other session's workspace
        h.server.layout.snapshots,  # the snapshot store
        h.server.layout.db,
        Path(h.config.state_dir),
        repo_root / "pyproject.toml",  # the repo root (config.yaml lives there)
        repo_root / ".state",
        redis_server.data_dir,  # the fleet's Redis data
    ]
    out = await h.bash(b, _absent(hidden) + "; grep -rl secret-a /tmp /workspace /var /run /opt /work /root 2>/dev/null; echo end")
    assert out["stdout"] == "end\n"
    # writable: only the workspace, the guest state dir and /tmp
    probe = "for d in / /usr /etc /opt/atefleet/guest /work /run; do touch $d/x 2>/dev/null && echo WROTE $d; done"
    out = await h.bash(b, probe + "; touch /workspace/x /tmp/x /var/lib/atefleet-guest/x && echo ok")
    assert out["stdout"] == "ok\n"


@pytest.mark.parametrize("level", LEVELS)
async def test_host_loopback_services_are_unreachable(
    start_substrate: Start, level: str, redis_server: EmbeddedRedis
) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    substrate_port = int(h.server.address.rpartition(":")[2])
    for port in (redis_server.port, substrate_port):
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
        )
        out = await h.bash(a, f'python3 -c "{code}" 2>&1 | tail -1')
        assert "CONNECTED" not in out["stdout"] and "refused" in out["stdout"].lower()


@pytest.mark.parametrize("level", LEVELS)
async def test_ps_shows_only_its_own_processes(start_substrate: Start, level: str) -> None:
    h, a, _ = await _two_actors(start_substrate, level)
    out = await h.bash(a, "ps -e -o uid=,comm=")
    rows = [line.split() for line in out["stdout"].splitlines()]
    uids = {int(r[0]) for r in rows}
    assert uids <= {0, h.server.control.slots.get(a.pod_name).uid}  # type: ignore[union-attr]
    assert len(rows) <= 6, rows  # init, guest, the shell, ps


@pytest.mark.parametrize("level", LEVELS)
async def test_fork_bomb_and_memory_hog_are_contained(start_substrate: Start, level: str) -> None:
    h, a, b = await _two_actors(start_substrate, level)
    # given a memory hog: it fails inside the sandbox, the guest keeps serving
    out = await h.bash(a, "python3 -c 'x = bytearray(1 << 30)' 2>&1 | tail -1")
    assert "MemoryError" in out["stdout"]
    # given a fork bomb in the background, it hits the process limit
    await h.bash(a, "bomb() { bomb | bomb & }; (bomb) >/dev/null 2>&1 & echo started")
    cgroup = h.server.control.slots.get(a.pod_name)  # type: ignore[union-attr]
    await _until_pids_saturated(h, a.pod_name)
    # then the host and the other session stay healthy
    assert subprocess.run(["true"]).returncode == 0
    assert (await h.bash(b, "echo alive"))["stdout"] == "alive\n"
    # and suspending the bombed actor clears every one of its processes
    assert (await h.client.suspend_actor(ATESPACE, "a")).status is ActorStatus.SUSPENDED
    assert cgroup is not None and not _slot_processes(cgroup.uid)


def _slot_processes(uid: int) -> list[int]:
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        uid_line = next((line for line in text.splitlines() if line.startswith("Uid:")), "")
        if uid_line.split()[1:2] == [str(uid)]:
            pids.append(int(status.parent.name))
    return pids


async def _until_pids_saturated(h: Harness, slot: str, timeout_s: float = 20.0) -> None:
    """Until the bomb's uid holds about as many tasks as its RLIMIT_NPROC allows."""
    uid = h.server.control.slots.get(slot).uid  # type: ignore[union-attr]
    async with asyncio.timeout(timeout_s):
        while len(_slot_processes(uid)) < 40:
            await asyncio.sleep(0.05)
