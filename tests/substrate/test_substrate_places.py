"""A suspend frees its running place once its sandbox is stopped, before its snapshot is
written: a resume of another actor then runs alongside that write, and one that comes while the
suspend is still stopping the sandbox waits for it instead of being refused. Real gRPC, real
sandboxes; the snapshot write and the stop are held open by wrapping the real ones."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from common.substrate import ActorStatus, NoFreeWorkers
from local_substrate.control import Control
from tests.substrate.conftest import ATESPACE, Start

pytestmark = pytest.mark.non_root


async def test_a_resume_runs_while_another_actors_snapshot_is_written(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await start_substrate(slots=1)
    for name in ("a", "b", "c"):
        await h.actor(name)
    a = await h.client.resume_actor(ATESPACE, "a")
    await h.bash(a, "echo kept > f")
    writing, release = threading.Event(), threading.Event()
    write = Control._checkpoint

    def held_write(self: Control, *args: Any) -> Any:
        writing.set()
        release.wait(30)
        return write(self, *args)

    monkeypatch.setattr(Control, "_checkpoint", held_write)
    suspend = asyncio.create_task(h.client.suspend_actor(ATESPACE, "a"))
    try:
        assert await asyncio.to_thread(writing.wait, 30)
        b = await h.client.resume_actor(ATESPACE, "b")
        assert b.status is ActorStatus.RUNNING
        assert not suspend.done()
        # One place, b's: a third actor is refused at once, not kept waiting for a's write.
        with pytest.raises(NoFreeWorkers):
            await h.client.resume_actor(ATESPACE, "c")
    finally:
        release.set()
    assert (await suspend).status is ActorStatus.SUSPENDED
    await h.client.suspend_actor(ATESPACE, "b")
    a = await h.client.resume_actor(ATESPACE, "a")
    assert (await h.bash(a, "cat f"))["stdout"] == "kept\n"


async def test_a_resume_waits_for_a_suspend_that_is_stopping_its_sandbox(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await start_substrate(slots=1)
    for name in ("a", "b"):
        await h.actor(name)
    await h.client.resume_actor(ATESPACE, "a")
    stopping, release = asyncio.Event(), asyncio.Event()
    freeze: Callable[..., Awaitable[bool]] = Control._freeze

    async def held_freeze(self: Control, *args: Any) -> bool:
        stopping.set()
        await release.wait()
        return await freeze(self, *args)

    monkeypatch.setattr(Control, "_freeze", held_freeze)
    suspend = asyncio.create_task(h.client.suspend_actor(ATESPACE, "a"))
    await asyncio.wait_for(stopping.wait(), 30)
    resume = asyncio.create_task(h.client.resume_actor(ATESPACE, "b"))
    await asyncio.sleep(0.3)
    assert not resume.done()  # waiting for a's place, not refused
    release.set()
    assert (await resume).status is ActorStatus.RUNNING
    assert (await suspend).status is ActorStatus.SUSPENDED
