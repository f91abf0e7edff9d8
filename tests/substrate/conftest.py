"""Fixtures: a real local_substrate (real gRPC, real sandboxes, real guests) and a real client."""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.config import Config, parse_config
from common.guest_client import GuestClient
from common.routing import LocalGuestRouter
from common.substrate import Actor, ActorStatus, SubstrateClient, make_substrate_client
from local_substrate.sandbox import nproc_counted_per_sandbox
from local_substrate.server import LocalSubstrate
from local_substrate.slots import UID_BLOCK, running_as

ATESPACE = "default"
TEMPLATE = "default-env-template"


#: The template for `sandbox: none`: there a normal user's RLIMIT_NPROC (`max_pids`) counts every
#: process of the uid, the rest of the suite's fleets and their frozen sandboxes included, so its
#: limit must not depend on what else runs: this user's own hard limit (prlimit cannot raise it).
_NPROC_HARD = resource.getrlimit(resource.RLIMIT_NPROC)[1]
UNSANDBOXED = {"name": TEMPLATE, "limits": {
    "max_pids": 1 << 20 if _NPROC_HARD == resource.RLIM_INFINITY else min(1 << 20, _NPROC_HARD)}}


#: Sandboxes are kept frozen where each one's RLIMIT_NPROC counts only its own processes: as root
#: (a uid per slot), or bwrap on a kernel that counts per user namespace (control.can_keep_frozen).
FREEZES = os.geteuid() == 0 or nproc_counted_per_sandbox("bwrap")
needs_freezing = pytest.mark.skipif(
    not FREEZES, reason="this kernel counts RLIMIT_NPROC for the fleet's uid as a whole and this is not "
    "root: stopped sandboxes would use up the running ones' process budget, so none is kept frozen"
)


def substrate_config(state_dir: Path, **local: Any) -> Config:
    """A config whose local Substrate keeps its state in `state_dir` (short: unix socket paths)."""
    envs = local.pop("environments", None)
    auth = local.pop("auth", None)
    data: dict[str, Any] = {"state_dir": str(state_dir), "local_substrate": {"stop_grace_s": 2, **local}}
    if envs is not None:
        data["environments"] = envs
    if auth is not None:
        data["auth"] = auth
    return parse_config(data)


@dataclass
class Harness:
    """One running local Substrate and a client of it."""

    config: Config
    server: LocalSubstrate
    client: SubstrateClient
    guests: list[GuestClient] = field(default_factory=list)

    async def actor(self, name: str, template: str = TEMPLATE) -> Actor:
        await self.client.ensure_atespace(ATESPACE)
        return await self.client.ensure_actor(ATESPACE, name, template)

    async def bash(self, actor: Actor, command: str) -> dict[str, Any]:
        """Run `command` in the actor through its real guest."""
        address = await LocalGuestRouter(self.config).address(actor)
        guest = GuestClient(address, actor=actor.name)
        self.guests.append(guest)
        result, _ = await guest.run(uuid.uuid4().hex, "bash", {"command": command})
        return dict(result)

    async def running(self, name: str) -> Actor:
        """Resume `name`; it must answer RUNNING."""
        actor = await self.client.resume_actor(ATESPACE, name)
        assert actor.status is ActorStatus.RUNNING
        return actor

    def sandbox_pid(self, actor: str) -> int:
        """The pid of the sandbox `actor` has (running or frozen)."""
        control = self.server.control
        assert control is not None
        slot = next(s for s in control.slots.slots if s.actor == actor)
        assert slot.process is not None
        return slot.process.pid

    def sandbox_roots(self, actor: str) -> list[int]:
        """The roots of the process trees of `actor`'s sandbox: its launcher, and at the bwrap
        level the guest the zygote forked (local_substrate/zygote.py)."""
        control = self.server.control
        assert control is not None
        slot = next(s for s in control.slots.slots if s.actor == actor)
        assert slot.process is not None
        return slot.process.roots()

    async def close(self, suspend_running: bool = True) -> None:
        for g in self.guests:
            await g.aclose()
        await self.client.close()
        await self.server.stop(suspend_running=suspend_running)


Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
def state_dir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="lsub-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def start_harness(config: Config) -> Harness:
    server = LocalSubstrate(config, "127.0.0.1:0")
    await server.start()
    return Harness(config, server, make_substrate_client(config, server.address))


@pytest.fixture
async def start_substrate(state_dir: Path) -> AsyncIterator[Start]:
    """Factory: `await start_substrate(slots=2, sandbox="bwrap", ...)` → a started Harness."""
    started: list[Harness] = []
    blocks: set[int] = set()  # the first uid of each server's block (root only)

    async def start(**local: Any) -> Harness:
        harness = await start_harness(substrate_config(state_dir, **local))
        started.append(harness)
        if os.geteuid() == 0:
            blocks.add(json.loads(harness.server.layout.status.read_text())["uid_first"])
        return harness

    yield start
    for h in started:
        if h.server.running:
            await h.close()
    # Every test checks that its servers ended all their sandboxes: a process left running as a
    # server's uids would share them with the next server's sandboxes (slots.UID_BLOCK).
    if blocks:
        left = [pid for first in blocks for pid in running_as(range(first, first + UID_BLOCK))]
        assert not left, f"processes outlived their local Substrate: {left}"
