"""Workspace data: survives suspend → resume (in another slot too), golden snapshots seed new
sessions, capacity is shared fairly, and a restart of the server loses nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.substrate import ActorStatus, NoFreeWorkers, SubstrateClient
from tests.substrate.conftest import ATESPACE, Harness, Start, start_harness, substrate_config

GOLDEN_TEMPLATE = {
    "name": "golden-tpl",
    "setup": ["echo baked > golden.txt", "mkdir -p tools && echo t > tools/x"],
}
GOLDEN_ENV = [{"name": "gold", "template": "golden-tpl"}, {"name": "default-env"}]


async def test_a_file_survives_suspend_and_resume_in_another_slot(start_substrate: Start) -> None:
    h = await start_substrate(slots=2, frozen_max=0)  # the snapshot's path (frozen: test_substrate_frozen)
    await h.actor("a1")
    first = await h.client.resume_actor(ATESPACE, "a1")
    await h.bash(first, "mkdir -p d && echo hello > d/f.txt && ln -s /usr/bin/env d/link")
    await h.client.suspend_actor(ATESPACE, "a1")
    # the least recently used slot is the other one
    second = await h.client.resume_actor(ATESPACE, "a1")
    assert second.pod_name != first.pod_name
    out = await h.bash(second, "cat d/f.txt; readlink d/link; stat -c %u d/f.txt; id -u")
    lines = out["stdout"].split()
    assert lines[:2] == ["hello", "/usr/bin/env"]
    assert lines[2] == lines[3], "restored files belong to the new slot's uid"


async def test_new_sessions_start_from_the_golden_snapshot(start_substrate: Start) -> None:
    h = await start_substrate(slots=2, templates=[GOLDEN_TEMPLATE], environments=GOLDEN_ENV)
    await h.actor("g1", "golden-tpl")
    await h.actor("g2", "golden-tpl")
    g1 = await h.client.resume_actor(ATESPACE, "g1")
    control = h.server.control
    assert control is not None and "golden-tpl" in control.golden.bake_seconds, "first resume baked"
    assert (await h.bash(g1, "cat golden.txt tools/x"))["stdout"] == "baked\nt\n"
    await h.bash(g1, "rm golden.txt")
    g2 = await h.client.resume_actor(ATESPACE, "g2")
    assert (await h.bash(g2, "cat golden.txt"))["stdout"] == "baked\n"
    await h.client.suspend_actor(ATESPACE, "g1")
    g1 = await h.client.resume_actor(ATESPACE, "g1")
    assert (await h.bash(g1, "ls"))["stdout"] == "tools\n", "its own snapshot wins over the golden one"


async def test_boot_skips_the_golden_snapshot(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, templates=[GOLDEN_TEMPLATE], environments=GOLDEN_ENV)
    await h.actor("b1", "golden-tpl")
    b1 = await h.client.resume_actor(ATESPACE, "b1", boot=True)
    assert (await h.bash(b1, "ls -A | wc -l"))["stdout"].strip() == "0"


async def test_more_sessions_than_slots(start_substrate: Start) -> None:
    h = await start_substrate(slots=2)
    names = [f"c{i}" for i in range(5)]
    for n in names:
        await h.actor(n)
    # given all slots taken, further resumes get "no free workers"
    for n in names[:2]:
        await h.client.resume_actor(ATESPACE, n)
    for n in names[2:]:
        with pytest.raises(NoFreeWorkers):
            await h.client.resume_actor(ATESPACE, n)
    # then each succeeds once a slot frees
    for running, waiting in zip(names, names[2:], strict=False):
        await h.client.suspend_actor(ATESPACE, running)
        assert (await h.client.resume_actor(ATESPACE, waiting)).status is ActorStatus.RUNNING


async def _cycle(h: Harness, name: str, write: bool) -> None:
    """Resume (waiting for capacity), write or check the session's file, suspend."""
    while True:
        try:
            actor = await h.client.resume_actor(ATESPACE, name)
            break
        except NoFreeWorkers:
            await asyncio.sleep(0.01)
    if write:
        await h.bash(actor, f"echo {name} > own.txt")
    else:
        assert (await h.bash(actor, "cat own.txt"))["stdout"] == f"{name}\n"
    await h.client.suspend_actor(ATESPACE, name)


@pytest.mark.slow
async def test_200_sessions_through_4_slots_keep_every_file(start_substrate: Start) -> None:
    h = await start_substrate(slots=4)
    names = [f"s{i}" for i in range(200)]
    for n in names:
        await h.actor(n)
    sem = asyncio.Semaphore(6)  # a bit more demand than slots: exercises "no free workers"

    async def one(name: str, write: bool) -> None:
        async with sem:
            await _cycle(h, name, write)

    await asyncio.gather(*(one(n, True) for n in names))
    # every session's file, checked from its snapshot as the next resume would restore it
    control = h.server.control
    assert control is not None
    for n in names:
        rec = control.store.get(ATESPACE, n)
        assert rec is not None and rec.status.name == "SUSPENDED" and Path(rec.snapshot).exists()
    await asyncio.gather(*(one(n, False) for n in names[::10]))


async def test_restart_of_the_server_loses_no_actor_or_snapshot(state_dir: Path) -> None:
    config = substrate_config(state_dir, slots=2)
    h = await start_harness(config)
    await h.actor("r1")
    await h.actor("r2")
    r1 = await h.client.resume_actor(ATESPACE, "r1")
    await h.bash(r1, "echo one > f.txt")
    await h.client.suspend_actor(ATESPACE, "r1")
    r2 = await h.client.resume_actor(ATESPACE, "r2")
    await h.bash(r2, "echo two > f.txt")
    # a graceful stop snapshots running actors
    await h.close()
    h = await start_harness(config)
    try:
        assert {a.name: a.status async for a in h.client.list_actors(ATESPACE)} == {
            "r1": ActorStatus.SUSPENDED,
            "r2": ActorStatus.SUSPENDED,
        }
        for name, text in (("r1", "one"), ("r2", "two")):
            actor = await h.client.resume_actor(ATESPACE, name)
            assert (await h.bash(actor, "cat f.txt"))["stdout"] == f"{text}\n"
    finally:
        await h.close()


async def test_a_crashed_server_brings_running_actors_back_at_their_last_snapshot(state_dir: Path) -> None:
    config = substrate_config(state_dir, slots=1)
    (state_dir / "config.yaml").write_text(
        f"state_dir: {state_dir}\nlocal_substrate:\n  slots: 1\n  stop_grace_s: 2\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "local_substrate",
            "--config",
            str(state_dir / "config.yaml"),
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    status = state_dir / "local-substrate" / "status.json"
    try:
        async with asyncio.timeout(30):
            while not status.exists():
                await asyncio.sleep(0.02)
        reported = json.loads(status.read_text())
        assert reported["sandbox"] in ("bwrap", "unshare") and reported["slots"] == 1
        assert reported["pid"] == proc.pid
        address = reported["address"]
        token = state_dir / "local-substrate" / "token"
        async with SubstrateClient(address, token_file=str(token)) as client:
            h = Harness(config, None, client)  # type: ignore[arg-type]
            await h.actor("k1")
            actor = await client.resume_actor(ATESPACE, "k1")
            await h.bash(actor, "echo saved > f.txt")
            await client.suspend_actor(ATESPACE, "k1")
            actor = await client.resume_actor(ATESPACE, "k1")
            await h.bash(actor, "echo lost > f.txt")
            for g in h.guests:
                await g.aclose()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the guests die with the server (no sandbox outlives it)
        async with asyncio.timeout(10):
            while _processes_of(reported["uid_first"] + 1):
                await asyncio.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    h = await start_harness(config)
    try:
        actor = await h.client.get_actor(ATESPACE, "k1")
        assert actor.status is ActorStatus.SUSPENDED
        actor = await h.client.resume_actor(ATESPACE, "k1")
        assert (await h.bash(actor, "cat f.txt"))["stdout"] == "saved\n"
    finally:
        await h.close()


def _processes_of(uid: int) -> list[str]:
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"\nUid:\t{uid}\t" in status.read_text():
                found.append(status.parent.name)
        except OSError:
            pass
    return found


async def test_one_server_per_state_dir(state_dir: Path) -> None:
    config = substrate_config(state_dir, slots=1)
    h = await start_harness(config)
    try:
        with pytest.raises(RuntimeError, match="another local substrate"):
            await start_harness(config)
    finally:
        await h.close()
    # the lock goes with the server
    await (await start_harness(config)).close()
