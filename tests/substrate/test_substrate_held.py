"""Files held by a frozen sandbox (Control._suspend with `park`, ActorRecord.held), through real
gRPC, real sandboxes and guests: the fleet's own park keeps the sandbox frozen and writes no
snapshot; every way that sandbox can end (another actor needs its slot, the host kills it, its
guest dies after a resume, the server restarts, the disk is full) first writes the files it held,
so nothing a tenant wrote before a successful call is lost; a client's suspend writes them too;
a tree a snapshot would not keep exactly is written at the park, as before; deleting the actor
drops them."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

from common.substrate import Actor, NoFreeWorkers
from local_substrate import frozen
from local_substrate.control import Control
from local_substrate.store import ActorRecord
from tests.conftest import SANDBOX_LEVELS
from tests.substrate.conftest import ATESPACE, TEMPLATE, Harness, Start, needs_freezing, start_harness

pytestmark = [pytest.mark.non_root, needs_freezing]


def _control(h: Harness) -> Control:
    assert h.server.control is not None
    return h.server.control


def _record(h: Harness, name: str) -> ActorRecord:
    rec = _control(h).store.find_name(name)
    assert rec is not None
    return rec


def _snapshots(h: Harness, rec: ActorRecord) -> list[Path]:
    d = _control(h).snapshots.root / rec.uid
    return sorted(d.iterdir()) if d.is_dir() else []


async def _parked(h: Harness, name: str, content: str = "saved") -> int:
    """Create and resume `name`, write `content` to `f`, park it; the pid of its sandbox."""
    await h.actor(name)
    a = await h.running(name)
    await h.bash(a, f"echo {content} > f")
    pid = h.sandbox_pid(name)
    parked = await h.client.suspend_actor(ATESPACE, name, park=True)
    assert parked.snapshot_bytes is None  # no snapshot written, so none to size
    rec = _record(h, name)
    assert rec.held and not _snapshots(h, rec)
    return pid


async def _parked_after(start_substrate: Start, name: str, command: str) -> tuple[Harness, int, Actor]:
    """A one-slot local Substrate where `name` ran `command` and was parked: it, the pid of the
    sandbox, and the park's answer."""
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    await h.actor(name)
    await h.bash(await h.running(name), command)
    pid = h.sandbox_pid(name)
    return h, pid, await h.client.suspend_actor(ATESPACE, name, park=True)


async def _resumes_with(h: Harness, name: str, expected: str) -> None:
    a = await h.running(name)
    assert (await h.bash(a, "cat f; cat g 2>/dev/null; true"))["output"] == expected


async def _until(check: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_park_keeps_the_files_in_the_frozen_sandbox_and_writes_no_snapshot(
    start_substrate: Start, level: str
) -> None:
    h = await start_substrate(slots=1, frozen_max=2, sandbox=level)
    pid = await _parked(h, "hd-a")

    # the next resume continues the same sandbox, files included; so does the one after a second park
    for content in ("saved", "again"):
        a = await h.running("hd-a")
        assert h.sandbox_pid("hd-a") == pid
        out = await h.bash(a, f"cat f; echo {content} > f")
        assert out["output"] == "saved\n"
        await h.client.suspend_actor(ATESPACE, "hd-a", park=True)
        assert not _snapshots(h, _record(h, "hd-a"))
    await _resumes_with(h, "hd-a", "again\n")


async def test_a_clients_suspend_writes_the_files_a_park_held(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    pid = await _parked(h, "hd-c")

    # when a client suspends the parked actor, its files are written; the sandbox stays frozen
    suspended = await h.client.suspend_actor(ATESPACE, "hd-c")
    rec = _record(h, "hd-c")
    assert not rec.held and [str(p) for p in _snapshots(h, rec)] == [rec.snapshot]
    assert suspended.latest_snapshot == rec.snapshot and suspended.snapshot_bytes
    assert h.sandbox_pid("hd-c") == pid and _control(h).slots.frozen_of("hd-c") is not None
    await _resumes_with(h, "hd-c", "saved\n")
    assert h.sandbox_pid("hd-c") == pid

    # and the snapshot holds them: killed, the actor comes back from it
    await h.client.suspend_actor(ATESPACE, "hd-c")
    await _control(h).evict_frozen()
    await _resumes_with(h, "hd-c", "saved\n")
    assert h.sandbox_pid("hd-c") != pid


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_held_sandbox_evicted_for_another_actor_has_its_files_written_first(
    start_substrate: Start, level: str
) -> None:
    # one worker, room for one frozen sandbox more: c's resume needs a's slot
    h = await start_substrate(slots=1, frozen_max=1, sandbox=level)
    pid = await _parked(h, "hd-ev-a")
    await _parked(h, "hd-ev-b")
    await h.actor("hd-ev-c")
    await h.running("hd-ev-c")

    assert not Path(f"/proc/{pid}").exists()
    rec = _record(h, "hd-ev-a")
    assert not rec.held and [str(p) for p in _snapshots(h, rec)] == [rec.snapshot]
    await h.client.suspend_actor(ATESPACE, "hd-ev-c", park=True)
    await _resumes_with(h, "hd-ev-a", "saved\n")


async def test_a_held_sandbox_the_host_kills_keeps_its_files(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    pid = await _parked(h, "hd-k")
    for p in reversed(frozen.tree(pid)):
        os.kill(p, 9)

    await _until(lambda: not _record(h, "hd-k").held)
    await _until(lambda: all(s.actor != "hd-k" for s in _control(h).slots.slots))
    await _resumes_with(h, "hd-k", "saved\n")


async def test_a_guest_that_dies_after_a_park_keeps_the_files_it_held_and_wrote_since(
    start_substrate: Start,
) -> None:
    # (an actor whose files are all in its snapshot falls back to it, as a dead worker pod's does;
    # one whose files were held has no snapshot of them to fall back to, so they are written)
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    await _parked(h, "hd-d")
    a = await h.running("hd-d")
    await h.bash(a, "echo since > g")
    await h.server.kill_slot(a.pod_name)

    rec = _record(h, "hd-d")
    assert rec.status.name == "SUSPENDED" and not rec.held
    await _resumes_with(h, "hd-d", "saved\nsince\n")


async def test_a_restart_writes_the_files_frozen_sandboxes_held(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    await _parked(h, "hd-r")
    config = h.config
    await h.close(suspend_running=False)  # the sandboxes die with the server; their files stay

    h2 = await start_harness(config)
    try:
        await _until(lambda: not _record(h2, "hd-r").held)
        assert _snapshots(h2, _record(h2, "hd-r"))
        await _resumes_with(h2, "hd-r", "saved\n")
    finally:
        await h2.close()


async def test_a_park_of_a_tree_a_snapshot_would_not_keep_exactly_writes_it_then(
    start_substrate: Start,
) -> None:
    # a FIFO: left out of every snapshot, so the frozen sandbox (which has it) is not kept
    h, pid, parked = await _parked_after(start_substrate, "hd-fifo", "echo saved > f; mkfifo pipe")

    rec = _record(h, "hd-fifo")
    assert not rec.held and parked.dropped_count == 1 and parked.snapshot_bytes
    assert _control(h).slots.frozen_of("hd-fifo") is None
    await _until(lambda: not Path(f"/proc/{pid}").exists())
    await _resumes_with(h, "hd-fifo", "saved\n")


async def test_a_park_of_files_the_tenant_made_unreadable_keeps_them_and_their_mode(
    start_substrate: Start,
) -> None:
    # (root reads them, so the park holds them; a normal user's fleet reads them only by changing
    # their mode, which a frozen tree must not see, so the park writes the snapshot then)
    h, _, _ = await _parked_after(start_substrate, "hd-000", "echo saved > f; echo secret > s; chmod 000 s")

    rec = _record(h, "hd-000")
    if os.geteuid() == 0:
        assert rec.held and not _snapshots(h, rec)
    else:
        assert not rec.held and _snapshots(h, rec)
    a = await h.running("hd-000")
    out = await h.bash(a, "cat f; stat -c %a s; chmod 600 s; cat s")
    assert out["output"] == "saved\n0\nsecret\n"


async def test_a_park_over_the_templates_limits_is_refused_as_before(start_substrate: Start) -> None:
    h = await start_substrate(
        slots=1, frozen_max=2, sandbox="bwrap", templates=[{"name": TEMPLATE, "limits": {"workspace_mb": 2}}]
    )
    await h.actor("hd-big")
    a = await h.running("hd-big")
    await h.bash(a, "head -c 3M /dev/urandom > big")
    with pytest.raises(Exception, match="more than 2 MB of data"):
        await h.client.suspend_actor(ATESPACE, "hd-big", park=True)
    rec = _record(h, "hd-big")
    assert rec.status.name == "SUSPENDED" and not rec.held
    assert all(s.actor != "hd-big" for s in _control(h).slots.slots)


async def test_deleting_a_parked_actor_drops_the_files_it_held(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, frozen_max=2, sandbox="bwrap")
    pid = await _parked(h, "hd-del")
    uid = _record(h, "hd-del").uid
    await h.client.delete_actor(ATESPACE, "hd-del")

    await _until(lambda: not Path(f"/proc/{pid}").exists())
    await _until(lambda: all(s.actor != "hd-del" for s in _control(h).slots.slots))
    assert not (_control(h).snapshots.root / uid).exists()


async def test_a_full_disk_keeps_the_held_files_in_their_slot_until_they_are_written(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # when c's resume needs a's slot while the disk is full, then a's slot keeps its files
    h, disk, slot = await _evicted_while_full(start_substrate, monkeypatch, "hd-full")
    assert slot.holding and not slot.running and slot.process is None
    assert _record(h, "hd-full-a").held == slot.name

    # and a's own resume says so until the disk has room, then restores them
    with pytest.raises(Exception, match="No space left"):
        await h.client.resume_actor(ATESPACE, "hd-full-a")
    disk.full = False
    await _resumes_with(h, "hd-full-a", "saved\n")
    assert not _record(h, "hd-full-a").held


async def test_clearing_everything_frees_a_slot_holding_files(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, _, slot = await _evicted_while_full(start_substrate, monkeypatch, "hd-clr")
    _control(h).debug_clear()
    await _until(lambda: not slot.actor and not slot.holding)


class _FullDisk:
    """Every snapshot write fails with ENOSPC while `full`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = True
        write = Control._checkpoint

        def checkpoint(control: Control, *args: Any) -> Any:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return write(control, *args)

        monkeypatch.setattr(Control, "_checkpoint", checkpoint)


async def _evicted_while_full(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> tuple[Harness, _FullDisk, Any]:
    """One slot and one frozen sandbox more, `<prefix>-a` and `-b` parked, then the disk full:
    `<prefix>-c`'s resume, which needs a's slot, is refused, the slot keeping a's files. The
    server, the full disk and that slot."""
    h = await start_substrate(slots=1, frozen_max=1, sandbox="bwrap")
    await _parked(h, f"{prefix}-a")
    await _parked(h, f"{prefix}-b")
    disk = _FullDisk(monkeypatch)
    await h.actor(f"{prefix}-c")
    with pytest.raises(NoFreeWorkers):
        await h.client.resume_actor(ATESPACE, f"{prefix}-c")
    return h, disk, next(s for s in _control(h).slots.slots if s.actor == f"{prefix}-a")
