"""What a tenant can leave in its workspace, done the way a tenant does it (commands through the
real guest inside the sandbox, at each sandbox level), against snapshot, restore, slot reset,
quotas and disk retention: the actor still suspends and resumes with its other files, or the
suspend is refused with a clear error and the actor is back at its last snapshot, slot freed.
As a normal user (bwrap only) the tenant's mode-000 dirs and files are the fleet's own uid's:
walks give the owner its bits back instead of failing."""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from common.substrate import Actor, ActorStatus, SnapshotFailed
from local_substrate.snapshots import restore_snapshot
from local_substrate.trees import remove_tree
from tests.conftest import SANDBOX_LEVELS
from tests.substrate.conftest import ATESPACE, TEMPLATE, Harness, Start

pytestmark = pytest.mark.non_root

#: A 2,500-level tree: deeper than PATH_MAX as a path, and than Python's recursion limit.
DEEP = 2500
MAKE_DEEP = (
    'python3 -c \'import os\nfor _ in range({n}): os.mkdir("d"); os.chdir("d")\n'
    'open("leaf", "w").write("deep")\''
)
READ_DEEP = 'python3 -c \'import os\nfor _ in range({n}): os.chdir("d")\nprint(open("leaf").read())\''


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """The local Substrate's state dir, deleted with `remove_tree` (these trees defeat shutil's)."""
    path = Path(tempfile.mkdtemp(prefix="lsub-", dir="/tmp"))
    yield path
    remove_tree(str(path))


def _template(**limits: int) -> dict[str, object]:
    return {"name": TEMPLATE, "limits": limits}


async def _start(start_substrate: Start, level: str, slots: int = 1, **limits: int) -> Harness:
    # Sandboxes are not kept frozen: these tests reuse a slot for the next actor.
    h = await start_substrate(slots=slots, frozen_max=0, sandbox=level, templates=[_template(**limits)])
    assert h.server.level == level
    return h


async def _running(h: Harness, name: str) -> tuple[str, Actor]:
    await h.actor(name)
    actor = await h.client.resume_actor(ATESPACE, name)
    assert (await h.bash(actor, "echo kept > kept.txt"))["exit_code"] == 0
    return name, actor


async def _kept_after_resume(h: Harness, name: str) -> str:
    actor = await h.client.resume_actor(ATESPACE, name)
    return str((await h.bash(actor, "cat kept.txt"))["stdout"])


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_special_files_are_dropped_and_reported_on_the_suspend(
    start_substrate: Start, level: str
) -> None:
    h = await _start(start_substrate, level)
    name, actor = await _running(h, "a1")
    # given FIFOs and a listening unix socket in the workspace, and a device node attempted
    made = await h.bash(actor, (
        "mkfifo pipe && mkdir sub && mkfifo sub/pipe2 && "
        "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' && "
        "(mknod null c 1 3 2>/dev/null && echo MKNOD-WORKED || echo mknod refused)"
    ))  # fmt: skip
    assert made["exit_code"] == 0 and made["stdout"] == "mknod refused\n", made
    # when suspended, then the answer reports what was left out, and nothing else is lost
    suspended = await h.client.suspend_actor(ATESPACE, name)
    assert suspended.status is ActorStatus.SUSPENDED
    assert suspended.dropped_count == 3
    assert suspended.snapshot_bytes and suspended.snapshot_bytes > 0
    assert set(suspended.dropped_files) == {"workspace/pipe", "workspace/sub/pipe2", "workspace/sock"}
    assert await _kept_after_resume(h, name) == "kept\n"
    actor = await h.client.get_actor(ATESPACE, name)
    assert (await h.bash(actor, "ls -A sub; test -e pipe || echo gone"))["stdout"] == "gone\n"
    # and the next snapshot, without special files, reports none
    assert (await h.client.suspend_actor(ATESPACE, name)).dropped_count == 0


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_deep_unreadable_sparse_oddly_named_trees_survive_suspend_and_resume(
    start_substrate: Start, level: str
) -> None:
    h = await _start(start_substrate, level)
    name, actor = await _running(h, "a1")
    # given a 2,500-level tree, a mode-000 dir (with a file) and file, a 900 MB sparse file,
    # names with a newline and a non-UTF-8 byte, and symlinks pointing out of the workspace
    made = await h.bash(actor, " && ".join((
        MAKE_DEEP.format(n=DEEP),
        "mkdir locked && echo inside > locked/f && chmod 000 locked",
        "echo secret > closed && chmod 000 closed",
        "truncate -s 900M sparse && printf tail >> sparse",
        "python3 -c 'open(b\"odd\\nname\\xff\", \"w\").write(\"odd\")'",
        "ln -s /etc/passwd abs && ln -s ../../../../.. up && ln -s /proc/self/root/etc root",
    )))  # fmt: skip
    assert made["exit_code"] == 0, made
    # when suspended and resumed, then every one of them is back as it was
    assert (await h.client.suspend_actor(ATESPACE, name)).status is ActorStatus.SUSPENDED
    assert await _kept_after_resume(h, name) == "kept\n"
    actor = await h.client.get_actor(ATESPACE, name)
    check = await h.bash(actor, " && ".join((
        READ_DEEP.format(n=DEEP),
        "stat -c %a locked closed | tr '\\n' ' ' && stat -c %s sparse",
        "chmod 700 locked && cat locked/f && tail -c 4 sparse && echo",
        "python3 -c 'print(open(b\"odd\\nname\\xff\").read())'",
        "readlink abs up root",
    )))  # fmt: skip
    assert check["exit_code"] == 0, check
    lines = check["stdout"].splitlines()
    assert lines[0] == "deep"
    assert lines[1].split() == ["0", "0", str((900 << 20) + 4)]
    assert lines[2:] == ["inside", "tail", "odd", "/etc/passwd", "../../../../..", "/proc/self/root/etc"]


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
@pytest.mark.parametrize(
    ("limits", "attack", "reason"),
    [
        ({"workspace_entries": 300}, "mkdir many && cd many && touch $(seq 1 400)", "more than 300 files"),
        ({"workspace_depth": 64}, MAKE_DEEP.format(n=100), "deeper than 64 dirs"),
        ({"workspace_mb": 2}, "head -c 3M /dev/urandom > big", "more than 2 MB of data"),
    ],
    ids=["entries", "depth", "bytes"],
)
async def test_a_snapshot_over_a_limit_is_refused_and_the_actor_is_back_at_its_last_snapshot(
    start_substrate: Start, level: str, limits: dict[str, int], attack: str, reason: str
) -> None:
    h = await _start(start_substrate, level, **limits)
    name, actor = await _running(h, "a1")
    await h.client.suspend_actor(ATESPACE, name)
    actor = await h.client.resume_actor(ATESPACE, name)
    # given a workspace over one of the template's limits
    assert (await h.bash(actor, attack))["exit_code"] == 0
    # when suspended, then the suspend is refused with the reason, not retried, not wedged
    with pytest.raises(SnapshotFailed, match=reason) as err:
        await h.client.suspend_actor(ATESPACE, name)
    assert not err.value.retryable and "back at its last snapshot" in str(err.value)
    assert (await h.client.get_actor(ATESPACE, name)).status is ActorStatus.SUSPENDED
    # and its slot is free: another actor resumes in the one slot
    await h.actor("bystander")
    assert (await h.client.resume_actor(ATESPACE, "bystander")).running
    await h.client.suspend_actor(ATESPACE, "bystander")
    # and the attacked actor resumes from its last snapshot, without the attack
    assert await _kept_after_resume(h, name) == "kept\n"
    actor = await h.client.get_actor(ATESPACE, name)
    assert (await h.bash(actor, "ls"))["stdout"] == "kept.txt\n"


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_tmp_is_capped_at_the_templates_tmp_mb(start_substrate: Start, level: str) -> None:
    h = await _start(start_substrate, level, tmp_mb=8)
    name, actor = await _running(h, "a1")
    # when /tmp is filled past tmp_mb, then the write fails with ENOSPC inside the sandbox
    fill = await h.bash(actor, "head -c 20M /dev/zero > /tmp/fill; echo rc=$?; du -m /tmp/fill | cut -f1")
    assert "No space left on device" in fill["stderr"], fill
    assert fill["stdout"].splitlines()[0] == "rc=1" and int(fill["stdout"].splitlines()[1]) <= 8
    # and the actor still suspends and resumes with its files
    assert (await h.client.suspend_actor(ATESPACE, name)).status is ActorStatus.SUSPENDED
    assert await _kept_after_resume(h, name) == "kept\n"


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_nothing_left_in_a_slot_reaches_its_next_actor(start_substrate: Start, level: str) -> None:
    h = await _start(start_substrate, level)
    name, actor = await _running(h, "a1")
    # given a first actor that leaves mode-000 dirs, a deep tree and read-only dirs behind
    made = await h.bash(actor, " && ".join((
        MAKE_DEEP.format(n=DEEP), "mkdir -p x/y && touch x/y/z && chmod 000 x/y && chmod 500 x",
        "mkdir shut && chmod 000 shut",
    )))  # fmt: skip
    assert made["exit_code"] == 0, made
    await h.client.suspend_actor(ATESPACE, name)
    # when another actor resumes in the same (only) slot, then it starts from an empty workspace
    await h.actor("next")
    nxt = await h.client.resume_actor(ATESPACE, "next")
    assert (await h.bash(nxt, "ls -A"))["stdout"] == ""
    slot = h.server.layout.slot_dir(nxt.pod_name)
    assert not (slot / "trash").exists()


@pytest.mark.needs_unshare  # chattr +i needs root
async def test_a_slot_whose_old_files_cannot_be_deleted_still_starts_clean_and_is_emptied_later(
    start_substrate: Start,
) -> None:
    h = await _start(start_substrate, "unshare")
    name, actor = await _running(h, "a1")
    await h.client.suspend_actor(ATESPACE, name)
    slot = h.server.layout.slot_dir(actor.pod_name)
    stuck = slot / "workspace" / "stuck"
    stuck.write_text("x")
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        # given a file in the slot that cannot be deleted, when the next actor resumes there,
        # then it starts clean anyway (what was left waits in the slot's trash)
        await h.actor("next")
        nxt = await h.client.resume_actor(ATESPACE, "next")
        assert (await h.bash(nxt, "ls -A"))["stdout"] == ""
        assert [p.name for p in (slot / "trash").rglob("stuck")] == ["stuck"]
    finally:
        for p in (slot / "trash").rglob("stuck"):
            subprocess.run(["chattr", "-i", str(p)], check=True)
    # and once deletable, the next reset empties the trash
    await h.client.suspend_actor(ATESPACE, "next")
    await h.client.resume_actor(ATESPACE, name)
    assert not (slot / "trash").exists()


async def test_snapshots_are_pruned_and_deleted_with_their_actor(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    name, actor = await _running(h, "a1")
    store = h.server.layout.snapshots
    # given three suspends, then only the latest snapshot is kept
    for _ in range(3):
        await h.client.suspend_actor(ATESPACE, name)
        await h.client.resume_actor(ATESPACE, name)
    latest = await h.client.suspend_actor(ATESPACE, name)
    assert [str(p) for p in store.rglob("*") if p.is_file()] == [latest.latest_snapshot]
    # when the actor is deleted, then its snapshots go with it
    await h.client.delete_actor(ATESPACE, name)
    assert list(store.iterdir()) == []


async def test_a_restart_deletes_stale_golden_and_orphaned_snapshots(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, templates=[{"name": TEMPLATE, "setup": ["echo one > setup.txt"]}])
    await _running(h, "a1")
    await h.client.suspend_actor(ATESPACE, "a1")
    layout = h.server.layout
    old_golden = list(layout.golden.iterdir())
    orphan = layout.snapshots / "0123456789abcdef"
    orphan.mkdir()
    (orphan / "1.tar.zst").write_bytes(b"")
    await h.close()
    # when the server restarts with the template's setup changed, then the old golden snapshot
    # and the snapshots of actors that no longer exist are gone; the live actor's is kept
    h2 = await start_substrate(slots=1, templates=[{"name": TEMPLATE, "setup": ["echo two > setup.txt"]}])
    assert len(old_golden) == 1 and not old_golden[0].exists() and not orphan.exists()
    assert await _kept_after_resume(h2, "a1") == "kept\n"
    await h2.client.suspend_actor(ATESPACE, "a1")
    # and a new actor bakes (and gets) the new setup, the only golden file left
    await h2.actor("a2")
    fresh = await h2.client.resume_actor(ATESPACE, "a2")
    assert (await h2.bash(fresh, "cat setup.txt"))["stdout"] == "two\n"
    assert len(list(layout.golden.iterdir())) == 1


def test_an_archive_written_before_this_release_restores_without_its_special_files(tmp_path: Path) -> None:
    """Snapshots made by tarfile's recursive `add` may hold FIFOs, hard links and the part's own
    dir: they restore (the FIFO left out) instead of failing the resume. Members that would land
    outside the slot (`..`, a path through a symlink) are skipped."""
    src = tmp_path / "src" / "workspace"
    src.mkdir(parents=True)
    (src / "a.txt").write_text("a")
    os.link(src / "a.txt", src / "hard.txt")
    os.mkfifo(src / "pipe")
    archive = tmp_path / "old.tar.zst"
    with open(archive, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as zw:
        with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tar.add(src, arcname="workspace")
            escape = tarfile.TarInfo("workspace/../../escaped.txt")
            tar.addfile(escape)
            link = tarfile.TarInfo("workspace/out")
            link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path)
            tar.addfile(link)
            tar.addfile(tarfile.TarInfo("workspace/out/through-link.txt"))
    dest = tmp_path / "slot"
    (dest / "workspace").mkdir(parents=True)
    (dest / "state").mkdir()
    restore_snapshot(
        archive, {"workspace": dest / "workspace", "state": dest / "state"}, os.getuid(), os.getgid()
    )
    assert sorted(os.listdir(dest / "workspace")) == ["a.txt", "hard.txt", "out"]
    assert (dest / "workspace" / "hard.txt").read_text() == "a"
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "through-link.txt").exists()
