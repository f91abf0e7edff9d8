"""Frozen sandboxes (local_substrate/frozen.py), through real gRPC, real sandboxes and guests:
a suspend keeps the actor's sandbox stopped and frees its worker; the next resume continues the
same processes; a frozen sandbox evicted for another actor is killed and its actor comes back
from its snapshot; and what a tenant does to dodge the freeze (fork storms, processes started in
a new session, SIGCONT from inside) does not keep anything running."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from common.guest_client import GuestClient, GuestUnavailable
from common.routing import LocalGuestRouter
from common.substrate import Actor, ActorStatus
from local_substrate import frozen, server
from tests.conftest import SANDBOX_LEVELS
from tests.substrate.conftest import ATESPACE, UNSANDBOXED, Harness, Start, needs_freezing

pytestmark = pytest.mark.non_root

async def _start(start_substrate: Start, level: str, slots: int = 1, frozen_max: int = 2) -> Harness:
    h = await start_substrate(slots=slots, frozen_max=frozen_max, sandbox=level)
    assert h.server.level == level
    return h


def _states(roots: list[int]) -> set[str]:
    return {frozen._state(p) for p in frozen.tree(*roots)}


async def _saved(h: Harness, name: str) -> Actor:
    """Create and resume `name`, write "saved" to `f`."""
    await h.actor(name)
    a = await h.running(name)
    await h.bash(a, "echo saved > f")
    return a


async def _saved_and_suspended(h: Harness, name: str) -> int:
    """`_saved`, then suspend it; the pid of its sandbox."""
    await _saved(h, name)
    pid = h.sandbox_pid(name)
    await h.client.suspend_actor(ATESPACE, name)
    return pid


async def _resumes_with_its_file(h: Harness, name: str) -> None:
    a = await h.running(name)
    assert (await h.bash(a, "cat f"))["output"] == "saved\n"


def _stopped_for_good(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or frozen._state(pid) in {"Z", "X", ""}


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_suspended_actor_continues_its_own_processes(start_substrate: Start, level: str) -> None:
    # given one worker and an actor with a file and a background process
    h = await _start(start_substrate, level)
    await h.actor("fz-a")
    a = await h.running("fz-a")
    started = await h.bash(a, "echo kept > f; (sleep 300 & echo $! > bg.pid); cat bg.pid")
    bg = started["output"].strip()
    pid = h.sandbox_pid("fz-a")
    roots = h.sandbox_roots("fz-a")
    assert len(roots) == (2 if level == "bwrap" else 1)  # bwrap: the zygote's guest is a tree apart

    # when it is suspended
    assert (await h.client.suspend_actor(ATESPACE, "fz-a")).status is ActorStatus.SUSPENDED

    # then every process of its sandbox is stopped and the worker is free for another actor
    assert _states(roots) <= frozen.STOPPED_STATES
    workers = await h.client.list_workers()
    assert len(workers) == 1 and not workers[0].actor_id
    await h.actor("fz-b")
    b = await h.running("fz-b")
    assert (await h.bash(b, "echo b"))["output"] == "b\n"
    await h.client.suspend_actor(ATESPACE, "fz-b")

    # when it is resumed, then the same sandbox runs on, background process and files included
    a = await h.running("fz-a")
    assert h.sandbox_pid("fz-a") == pid
    assert not (_states(roots) & {"T", "t"})
    out = await h.bash(a, f"cat f; kill -0 {bg} && echo alive")
    assert out["output"] == "kept\nalive\n"


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_an_evicted_frozen_actor_comes_back_from_its_snapshot(
    start_substrate: Start, level: str
) -> None:
    # given one worker and room for one frozen sandbox more (two slots in all), and two actors
    # resumed after a's suspend
    h = await _start(start_substrate, level, frozen_max=1)
    await _saved(h, "ev-a")
    pid = h.sandbox_pid("ev-a")
    await h.client.suspend_actor(ATESPACE, "ev-a")
    for other in ("ev-b", "ev-c"):  # b takes the empty slot; c needs a's
        await h.actor(other)
        await h.running(other)
        await h.client.suspend_actor(ATESPACE, other)

    # then a's processes are gone, and its resume restores its files into a new sandbox
    assert not Path(f"/proc/{pid}").exists()
    a = await h.running("ev-a")
    assert h.sandbox_pid("ev-a") != pid
    assert (await h.bash(a, "cat f"))["output"] == "saved\n"


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_tenant_cannot_keep_running_while_frozen(start_substrate: Start, level: str) -> None:
    # given a tenant with a process in a new session that counts, one that keeps forking, and one
    # that sends SIGCONT to every process it can see
    h = await _start(start_substrate, level)
    await h.actor("fz-t")
    a = await h.running("fz-t")
    await h.bash(a, (
        "setsid sh -c 'while :; do date +%s%N >> tick; sleep 0.05; done' >/dev/null 2>&1 < /dev/null & "
        "(while :; do sleep 0.01 & wait; done) >/dev/null 2>&1 < /dev/null & "
        "(while :; do kill -CONT -1 2>/dev/null; sleep 0.01; done) >/dev/null 2>&1 < /dev/null & "
        "sleep 0.3; echo started"
    ))  # fmt: skip
    roots = h.sandbox_roots("fz-t")
    control = h.server.control
    assert control is not None
    workspace = next(s for s in control.slots.slots if s.actor == "fz-t").dirs.workspace

    # when it is suspended, then nothing of it runs: the ticks stop. (Kept frozen, or, when the
    # tree would not stop in time on a loaded host, stopped for good: either way nothing runs.)
    await h.client.suspend_actor(ATESPACE, "fz-t")
    kept = control.slots.frozen_of("fz-t") is not None
    ticks = (workspace / "tick").read_text()
    await asyncio.sleep(0.5)
    assert (workspace / "tick").read_text() == ticks
    assert _states(roots) <= frozen.STOPPED_STATES
    if not kept:
        return

    # and when resumed, it runs on
    await h.running("fz-t")
    deadline = time.monotonic() + 10
    while (workspace / "tick").read_text() == ticks:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_server_that_stops_leaves_none_of_its_sandboxes_behind(
    start_substrate: Start, level: str
) -> None:
    # given a running actor with a background process, and one frozen by a suspend
    h = await _start(start_substrate, level, slots=2)
    await _saved_and_suspended(h, "fz-frozen")
    a = await _saved(h, "fz-running")
    await h.bash(a, "sleep 300 > /dev/null 2>&1 < /dev/null &")
    pids = frozen.tree(*h.sandbox_roots("fz-frozen"), *h.sandbox_roots("fz-running"))
    # when the server stops, snapshotting the running actor (a suspend that could keep it frozen)
    await h.close()
    # then every process of both sandboxes is gone: their uids go back to the next server
    assert all(_stopped_for_good(pid) for pid in pids)
    h = await _start(start_substrate, level, slots=2)
    await _resumes_with_its_file(h, "fz-running")
    await _resumes_with_its_file(h, "fz-frozen")


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_frozen_sandbox_that_dies_frees_its_slot(start_substrate: Start, level: str) -> None:
    # given a frozen actor whose sandbox the host kills (the OOM killer, an operator)
    h = await _start(start_substrate, level)
    pid = await _saved_and_suspended(h, "fz-k")
    for p in reversed(frozen.tree(pid)):
        os.kill(p, 9)

    # then its slot is freed and its resume restores the snapshot in a new sandbox
    control = h.server.control
    assert control is not None
    deadline = time.monotonic() + 10
    while control.slots.frozen_of("fz-k") is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    await _resumes_with_its_file(h, "fz-k")


async def test_freezing_a_large_tree_stops_all_of_it_and_lets_the_loop_run_meanwhile() -> None:
    # given a tree of a hundred processes (as a tenant can make, up to its process limit)
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", "for i in $(seq 100); do sleep 60 & done; echo ready; wait",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and await proc.stdout.readline() == b"ready\n"
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        # when it is frozen, on the event loop
        before = ticks
        assert await frozen.freeze(proc.pid)

        # then every process of it is stopped, and other work on the loop went on meanwhile: one
        # sandbox's freeze does not hold up the server's other calls
        pids = frozen.tree(proc.pid)
        assert len(pids) == 101 and _states([proc.pid]) <= frozen.STOPPED_STATES
        assert ticks > before
    finally:
        ticker.cancel()
        for p in reversed(frozen.tree(proc.pid)):
            os.kill(p, 9)
        await proc.wait()


@pytest.mark.parametrize("frozen_max", [0, 2])
async def test_without_freezing_or_a_pid_namespace_a_suspend_stops_the_sandbox(
    start_substrate: Start, frozen_max: int
) -> None:
    # frozen_max 0: freezing off; at level none a process could leave the tree and outlive the server
    h = await start_substrate(slots=1, frozen_max=frozen_max, sandbox="none", templates=[UNSANDBOXED])
    pid = await _saved_and_suspended(h, "fz-off")
    assert _stopped_for_good(pid)
    await _resumes_with_its_file(h, "fz-off")


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_sandbox_whose_snapshot_dropped_files_is_not_kept(
    start_substrate: Start, level: str
) -> None:
    # given a tenant with a fifo in its workspace (a snapshot drops special files)
    h = await _start(start_substrate, level)
    await h.actor("fz-fifo")
    a = await h.running("fz-fifo")
    await h.bash(a, "mkfifo pipe; echo saved > f")
    pid = h.sandbox_pid("fz-fifo")

    # when it is suspended, then the drop is reported and the sandbox is not kept frozen
    suspended = await h.client.suspend_actor(ATESPACE, "fz-fifo")
    assert suspended.dropped_count == 1
    control = h.server.control
    assert control is not None and control.slots.frozen_of("fz-fifo") is None
    assert _stopped_for_good(pid)

    # and its resume has exactly what the snapshot kept
    a = await h.running("fz-fifo")
    assert (await h.bash(a, "ls"))["output"] == "f\n"


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_an_address_from_before_the_suspend_does_not_reach_the_thawed_guest(
    start_substrate: Start, level: str
) -> None:
    h = await _start(start_substrate, level)
    await h.actor("fz-addr")
    before = await h.running("fz-addr")
    stale = await LocalGuestRouter(h.config).address(before)
    await h.client.suspend_actor(ATESPACE, "fz-addr")
    after = await h.running("fz-addr")
    assert after.pod_name == before.pod_name and after.pod_uid != before.pod_uid
    async with GuestClient(stale, actor="fz-addr") as guest:
        with pytest.raises(GuestUnavailable):
            await guest.run(uuid.uuid4().hex, "bash", {"command": "touch from-stale"})
    assert (await h.bash(after, "ls"))["output"] == ""


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_modes_the_tenant_set_are_what_it_resumes_with(start_substrate: Start, level: str) -> None:
    # given a tenant's unreadable dir and file (a fleet run as a normal user must give itself
    # read access to snapshot them: then the sandbox is not kept, the snapshot restores the modes)
    h = await _start(start_substrate, level)
    await h.actor("fz-modes")
    a = await h.running("fz-modes")
    await h.bash(a, "mkdir locked && echo in > locked/f && echo s > closed && chmod 000 locked closed")
    await h.client.suspend_actor(ATESPACE, "fz-modes")

    # when it resumes, then both are as it left them
    a = await h.running("fz-modes")
    assert (await h.bash(a, "stat -c '%n %a' locked closed"))["output"] == "locked 0\nclosed 0\n"


@needs_freezing
@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_a_low_disk_first_frees_the_files_of_frozen_sandboxes(
    start_substrate: Start, level: str
) -> None:
    # given a frozen actor, and a disk guard that finds the disk low (a reserve above any free space)
    h = await start_substrate(slots=1, frozen_max=2, sandbox=level, disk_reserve_mb=1 << 30,
                              disk_check_period_s=0.1)  # fmt: skip
    await _saved_and_suspended(h, "fz-disk")
    control = h.server.control
    assert control is not None

    # then the frozen sandbox is killed and its slot's files deleted, and the actor resumes from
    # its snapshot
    deadline = time.monotonic() + 10
    while control.slots.frozen_of("fz-disk") is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert not any(s.dirs.workspace.joinpath("f").exists() for s in control.slots.slots if not s.actor)
    await _resumes_with_its_file(h, "fz-disk")


@pytest.mark.parametrize("level", SANDBOX_LEVELS)
async def test_where_rlimit_nproc_counts_the_uid_as_a_whole_a_suspend_stops_the_sandbox(
        start_substrate: Start, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # (a kernel before 5.14 as a normal user: its answer stands in for the probe's on this one)
    monkeypatch.setattr(server, "nproc_counted_per_sandbox", lambda level: False)
    h = await _start(start_substrate, level)
    isolation = json.loads(h.server.layout.status.read_text())["isolation"]
    assert isolation["nproc_per_sandbox"] is False
    assert any("no suspended sandbox is kept frozen" in line for line in isolation["gives_up"])
    pid = await _saved_and_suspended(h, "fz-user")
    control = h.server.control
    assert control is not None and control.slots.frozen_of("fz-user") is None
    assert _stopped_for_good(pid)
    await _resumes_with_its_file(h, "fz-user")
