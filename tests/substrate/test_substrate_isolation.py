"""Sandbox isolation, for each level (bwrap and unshare), checked with commands run the way an
agent's commands run: through the real guest's bash tool inside the actor."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
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
    secret = uuid.uuid4().hex
    await h.bash(a, f"echo {secret} > mine.txt")
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
    out = await h.bash(
        b, _absent(hidden) + f"; grep -rl {secret} /tmp /workspace /var /run /opt /work 2>/dev/null; echo end"
    )
    assert out["stdout"] == "end\n"
    # writable: only the workspace, the guest state dir and /tmp
    dirs = "/ /usr /etc /opt/atefleet/guest /work /run"
    probe = f"for d in {dirs}; do touch $d/x 2>/dev/null && echo WROTE $d; done"
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
    # given a fork bomb in the background (setsid: the guest ends a command's process group
    # when the command returns), then it runs into the process limit
    # (every process forks forever and survives failed forks, so the limit stays hit)
    bomb = "import os, time\nwhile True:\n  try: os.fork()\n  except OSError: time.sleep(0.01)"
    await h.bash(a, f"printf '{bomb}' > /tmp/b.py; setsid python3 /tmp/b.py >/dev/null 2>&1 < /dev/null &")
    uid = h.server.control.slots.get(a.pod_name).uid  # type: ignore[union-attr]
    await _until_tasks(uid, LIMITED["limits"]["max_pids"] - 8)  # type: ignore[index]
    # then the host and the other session stay healthy
    assert subprocess.run(["true"]).returncode == 0
    assert (await h.bash(b, "echo alive"))["stdout"] == "alive\n"
    # and suspending the bombed actor clears every one of its processes
    assert (await h.client.suspend_actor(ATESPACE, "a")).status is ActorStatus.SUSPENDED
    async with asyncio.timeout(10):
        while _slot_processes(uid):
            await asyncio.sleep(0.02)


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


def _tasks(pids: list[int]) -> int:
    return sum(len(list(Path(f"/proc/{p}/task").glob("*"))) for p in pids)


async def _until_tasks(uid: int, count: int, timeout_s: float = 20.0) -> None:
    """Until the sandbox uid runs about as many tasks as its limit allows: the bomb hit it."""
    async with asyncio.timeout(timeout_s):
        while _tasks(_slot_processes(uid)) < count:
            await asyncio.sleep(0.05)


async def test_network_host_template_shares_the_hosts_network(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, templates=[{"name": "default-env-template", "network": "host"}])
    await h.actor("n")
    actor = await h.client.resume_actor(ATESPACE, "n")
    port = int(h.server.address.rpartition(":")[2])
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"
    assert (await h.bash(actor, f'python3 -c "{code}"'))["stdout"] == "CONNECTED\n"


async def test_template_skills_are_mounted_read_only_at_the_environments_path(
    start_substrate: Start, tmp_path: Path
) -> None:
    skills = tmp_path / "skills" / "greet"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("# greet\n")
    h = await start_substrate(
        slots=1,
        templates=[{"name": "skilled", "skills_dir": str(skills.parent)}],
        environments=[{"name": "sk", "template": "skilled", "skills_dir": "/opt/skills"}],
    )
    await h.actor("k", "skilled")
    actor = await h.client.resume_actor(ATESPACE, "k")
    out = await h.bash(
        actor, "cat /opt/skills/greet/SKILL.md; touch /opt/skills/x 2>/dev/null || echo read-only"
    )
    assert out["stdout"] == "# greet\nread-only\n"


async def test_without_a_sandbox_guests_still_run_and_the_level_says_so(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, sandbox="none")
    assert h.server.level == "none"
    status = json.loads(h.server.layout.status.read_text())
    assert status["sandbox"] == "none" and status["slots"] == 1
    await h.actor("plain")
    actor = await h.client.resume_actor(ATESPACE, "plain")
    assert (await h.bash(actor, "echo hi > f.txt && cat f.txt"))["stdout"] == "hi\n"


async def test_sandboxes_share_one_cpu_weight(start_substrate: Start) -> None:
    """Every process of every sandbox runs under the server's one weighted cpu group."""
    h = await start_substrate(slots=2, sandbox="bwrap", templates=[LIMITED], sandbox_cpu_weight=25)
    if h.server.control.cgroups.mode != "v1" or not Path("/sys/fs/cgroup/cpu").is_dir():
        pytest.skip("checked on cgroup v1 with a cpu controller (this machine's); v2 writes cpu.weight")
    await h.actor("a")
    a = await h.client.resume_actor(ATESPACE, "a")
    await h.bash(a, "sleep 30 > /dev/null 2>&1 < /dev/null &")
    uid = h.server.control.slots.get(a.pod_name).uid  # type: ignore[union-attr]
    groups = set()
    for pid in _slot_processes(uid):
        lines = (x.split(":", 2) for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
        path = next(p for _, controllers, p in lines if "cpu" in controllers.split(","))
        groups.add(path.rsplit("/", 1)[0])
    [parent] = groups
    assert parent.startswith("/atefleet-")
    assert Path(f"/sys/fs/cgroup/cpu{parent}/cpu.shares").read_text().strip() == str(25 * 1024 // 100)
