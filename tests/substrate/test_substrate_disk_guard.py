"""The disk guard against a tenant filling the host between suspends, done as a tenant does it
(commands through the real guest, at each sandbox level, over real gRPC): while the disk is low
(here: a reserve larger than the disk's free space) a running actor over its template's
`workspace_mb` is stopped, back at its last snapshot, its files deleted, and its next resume says
why once; a session within its limits keeps running with its files. With the disk fine nothing
is measured at all. The walk it uses never leaves a tree whose dirs move under it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from common.guest_client import GuestError
from common.substrate import ActorStatus, SnapshotFailed, WorkspaceOverQuota
from local_substrate.disk_guard import DiskGuard
from local_substrate.snapshots import SnapshotLimits, SnapshotRefused, measure
from local_substrate.trees import TreeChanged, walk
from tests.conftest import SANDBOX_LEVELS
from tests.substrate.conftest import ATESPACE, TEMPLATE, Harness, Start

pytestmark = pytest.mark.non_root

#: The template's workspace quota here (MB), and what the tenant writes past it.
WORKSPACE_MB = 8
HOG = "head -c 20M /dev/urandom > big && sleep 60"
#: More than any disk has free: the guard is active from its first check.
RESERVE_ALWAYS_LOW_MB = 1 << 30
PERIOD_S = 0.1


async def _start(start_substrate: Start, level: str, reserve_mb: int) -> Harness:
    h = await start_substrate(
        slots=2, sandbox=level, disk_reserve_mb=reserve_mb, disk_check_period_s=PERIOD_S,
        templates=[{"name": TEMPLATE, "limits": {"workspace_mb": WORKSPACE_MB}}],
    )  # fmt: skip
    assert h.server.level == level
    return h


def _guard(h: Harness) -> DiskGuard:
    assert h.server.disk_guard is not None
    return h.server.disk_guard


async def _until(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        met = condition()
        if met if isinstance(met, bool) else await met:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_tenant_over_its_quota_while_the_disk_is_low_is_stopped_and_a_bystander_is_not(
    start_substrate: Start, level: str
) -> None:
    h = await _start(start_substrate, level, RESERVE_ALWAYS_LOW_MB)
    # given a hog whose last snapshot holds kept.txt, and a bystander within its quota
    await h.actor("hog")
    hog = await h.client.resume_actor(ATESPACE, "hog")
    assert (await h.bash(hog, "echo kept > kept.txt"))["exit_code"] == 0
    await h.client.suspend_actor(ATESPACE, "hog")
    hog = await h.client.resume_actor(ATESPACE, "hog")
    hog_slot = h.server.control.slots.get(hog.pod_name) if h.server.control else None
    assert hog_slot is not None
    await h.actor("bystander")
    bystander = await h.client.resume_actor(ATESPACE, "bystander")
    assert (await h.bash(bystander, "head -c 2M /dev/urandom > mine && echo ok"))["stdout"] == "ok\n"
    # when the hog writes past its workspace_mb, then its call in flight ends with its guest
    with pytest.raises(GuestError):
        await h.bash(hog, HOG)

    async def hog_suspended() -> bool:
        return (await h.client.get_actor(ATESPACE, "hog")).status is ActorStatus.SUSPENDED

    await _until(hog_suspended)
    # and its files are deleted at once (the disk is low now), the slot freed
    await _until(lambda: not hog_slot.actor)
    assert _guard(h).stats.stopped == 1
    assert not (hog_slot.dirs.workspace / "big").exists()
    # and its next resume says why, once; the one after restores its last snapshot
    with pytest.raises(WorkspaceOverQuota, match=rf"workspace over quota: .*more than {WORKSPACE_MB} MB"):
        await h.client.resume_actor(ATESPACE, "hog")
    assert (await h.client.get_actor(ATESPACE, "hog")).status is ActorStatus.SUSPENDED
    hog = await h.client.resume_actor(ATESPACE, "hog")
    assert (await h.bash(hog, "cat kept.txt; test -e big || echo no-big"))["stdout"] == "kept\nno-big\n"
    # and the bystander, measured all along, still runs the same incarnation with its files
    still = await h.client.get_actor(ATESPACE, "bystander")
    assert still.status is ActorStatus.RUNNING and still.pod_uid == bystander.pod_uid
    assert (await h.bash(still, "wc -c < mine"))["stdout"] == f"{2 << 20}\n"
    assert _guard(h).stats.measured > _guard(h).stats.stopped


@pytest.mark.parametrize("level", SANDBOX_LEVELS[:1])
async def test_with_the_disk_fine_nothing_is_measured_or_stopped(start_substrate: Start, level: str) -> None:
    # given a reserve any test disk has free, and a tenant over its workspace_mb
    h = await _start(start_substrate, level, reserve_mb=1)
    await h.actor("hog")
    hog = await h.client.resume_actor(ATESPACE, "hog")
    assert (await h.bash(hog, "head -c 20M /dev/urandom > big && echo ok"))["stdout"] == "ok\n"
    # when the guard has checked the free space a few times
    await _until(lambda: _guard(h).stats.checks >= 5)
    # then it measured nothing and stopped nothing: the quota applies at suspend, as before
    stats = _guard(h).stats
    assert (stats.low, stats.measured, stats.stopped) == (0, 0, 0)
    assert (await h.client.get_actor(ATESPACE, "hog")).pod_uid == hog.pod_uid
    with pytest.raises(SnapshotFailed, match=f"more than {WORKSPACE_MB} MB"):
        await h.client.suspend_actor(ATESPACE, "hog")


def test_a_walk_whose_dir_is_moved_away_under_it_stops_instead_of_leaving_the_tree(tmp_path: Path) -> None:
    # given a tree root/a/b/c/f and, beside root, a dir the walk must never see
    root = tmp_path / "root"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c" / "f").write_text("x")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("x")
    seen: list[str] = []
    # when the tenant moves c up to root while the walk is inside it
    with pytest.raises(TreeChanged):
        for entry in walk(str(root), 100):
            seen.append(entry.path)
            if entry.path == "a/b/c/f":
                os.rename(root / "a" / "b" / "c", root / "c")
    # then the walk ended there: climbing out of c would have reached root's parent
    assert seen == ["a", "a/b", "a/b/c", "a/b/c/f"]


def test_measure_counts_what_a_snapshot_would_hold_from_lstats_alone(tmp_path: Path) -> None:
    ws, state = tmp_path / "workspace", tmp_path / "state"
    ws.mkdir()
    state.mkdir()
    (ws / "data").write_bytes(b"x" * (3 << 20))
    with open(ws / "sparse", "wb") as f:  # 900 MB of holes: counted by its data, as stored
        f.truncate(900 << 20)
        f.write(b"tail")
    (ws / "link").symlink_to("/etc/passwd")
    os.mkfifo(ws / "fifo")  # never opened
    usage = measure({"workspace": ws, "state": state}, SnapshotLimits(8 << 20, 100, 10))
    assert usage.entries == 4 and (3 << 20) <= usage.bytes < (4 << 20)
    with pytest.raises(SnapshotRefused, match="more than 2 MB of data"):
        measure({"workspace": ws, "state": state}, SnapshotLimits(2 << 20, 100, 10))
    with pytest.raises(SnapshotRefused, match="more than 3 files"):
        measure({"workspace": ws, "state": state}, SnapshotLimits(8 << 20, 3, 10))
