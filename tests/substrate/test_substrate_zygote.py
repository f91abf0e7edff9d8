"""Guests forked from the zygote (local_substrate/zygote.py, guest/zygote.py), through a real
local Substrate with real bwrap sandboxes: the guest is what setpriv and prlimit would have made
it, nothing of the zygote reaches the tenant, and a zygote that dies or fails costs no guest.
Run as root and (CI) as a normal user, where the sandbox is a user namespace."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import local_substrate.zygote as zygote_module
from common.substrate import Actor, ActorStatus
from common.zygote_protocol import DEATH_FD, LISTEN_FD, NAMESPACES
from local_substrate.control import Control
from local_substrate.sandbox import SandboxProcess
from local_substrate.zygote import Zygote
from tests.substrate.conftest import ATESPACE, Harness, Start

pytestmark = [pytest.mark.non_root, pytest.mark.needs_bwrap]

ROOT = os.geteuid() == 0


def _control(h: Harness) -> Control:
    assert h.server.control is not None
    return h.server.control


def _process(h: Harness, actor: str) -> SandboxProcess:
    slot = next(s for s in _control(h).slots.slots if s.actor == actor)
    assert slot.process is not None
    return slot.process


def _zygote(h: Harness) -> Zygote:
    zygote = _control(h).zygote
    assert zygote is not None
    return zygote


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, v in (line.split(":", 1) for line in lines)}


def _waiter(process: SandboxProcess) -> int:
    init = int(Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()[0])
    return int(Path(f"/proc/{init}/task/{init}/children").read_text().split()[0])


async def _until(check: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _forked(start_substrate: Start, name: str) -> tuple[Harness, Actor, SandboxProcess, int]:
    """A local Substrate of one bwrap slot running `name`: its sandbox and the forked guest's pid."""
    h = await start_substrate(slots=1, sandbox="bwrap")
    await h.actor(name)
    actor = await h.running(name)
    process = _process(h, name)
    assert process.guest is not None
    return h, actor, process, process.guest[0]


async def test_a_forked_guest_is_what_setpriv_and_prlimit_would_make_it(start_substrate: Start) -> None:
    h, a, process, guest = await _forked(start_substrate, "zg-a")
    waiter = _waiter(process)
    slot = next(s for s in _control(h).slots.slots if s.actor == "zg-a")

    # then it is in every namespace of its sandbox and its root is the sandbox's (readable from
    # here as root only: the guest is not dumpable, and its memory was made outside the sandbox's
    # user namespace, so as a normal user not even its owner may look; the commands it starts,
    # below, are in the same namespaces either way)
    if ROOT:
        for name in NAMESPACES:
            assert os.readlink(f"/proc/{guest}/ns/{name}") == os.readlink(f"/proc/{waiter}/ns/{name}"), name
        assert os.stat(f"/proc/{guest}/root") == os.stat(f"/proc/{waiter}/root")
    # and it holds no capability in any set, cannot gain one, and runs as the slot's uid
    status = _status(guest)
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[field], 16) == 0, field
    assert status["NoNewPrivs"] == "1"
    uid = slot.uid if ROOT else os.getuid()
    assert {int(u) for u in status["Uid"].split()} == {uid}
    if ROOT:
        assert status["Groups"] == ""
    # with the sandbox's rlimits (the waiter's came from prlimit), oom score and cgroup
    assert Path(f"/proc/{guest}/limits").read_text() == Path(f"/proc/{waiter}/limits").read_text()
    assert Path(f"/proc/{guest}/oom_score_adj").read_text().strip() == "1000"
    assert Path(f"/proc/{guest}/cgroup").read_text() == Path(f"/proc/{waiter}/cgroup").read_text()

    # and from inside: a pid of the sandbox's namespace, whose commands are in the waiter's
    # (pid 2) namespaces, in its root, with the sandbox's environment
    namespaces = " ".join(NAMESPACES)
    out = await h.bash(a, (
        "grep -E '^(CapEff|NoNewPrivs)' /proc/$PPID/status; echo $PPID; pwd; "
        f"for n in {namespaces}; do "
        "test $(readlink /proc/self/ns/$n) = $(readlink /proc/2/ns/$n) || echo $n; done; "
        "test /proc/self/root -ef /proc/2/root || echo root; env"
    ))  # fmt: skip
    lines = out["stdout"].splitlines()
    assert lines[:4] == ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "3", "/workspace"]
    assert lines[4].startswith(("PATH=", "HOME=", "TMPDIR=", "LANG=", "PWD=")), lines[4]
    assert "HOME=/workspace" in lines and not [line for line in lines if "ATEFLEET" in line]


async def test_the_tenant_sees_no_zygote_no_host_path_and_none_of_its_fds(start_substrate: Start) -> None:
    h, a, _, guest = await _forked(start_substrate, "zg-t")
    ends = {os.readlink(f"/proc/{guest}/fd/{fd}") for fd in (LISTEN_FD, DEATH_FD)} if ROOT else set()
    code_root = str(Path(zygote_module.__file__).resolve().parent.parent)
    out = await h.bash(a, (
        # (built at run time, so this shell's own command line does not match)
        "pat=guest.; pat=${pat}zygote; for f in /proc/[0-9]*/cmdline; do "
        "case \"$(tr '\\0' ' ' < $f 2>/dev/null)\" in *$pat*) echo $f;; esac; done | wc -l; "
        "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; "
        # (a command's own fds: its stdout a file, so only stderr is a pipe)
        "ls -l /proc/self/fd > /tmp/fds; tr -s ' ' < /tmp/fds | cut -d' ' -f11 | tr '\\n' ' '"
    ))  # fmt: skip
    count, cmdline, fds = out["stdout"].splitlines()
    # one process shows the zygote's command line, the guest forked from it: not the zygote
    assert count == "1" and "guest.zygote" in cmdline
    # the guest's shows no host path of the fleet's (bwrap's own, pid 1, names its mounts, as
    # without the zygote), and none of the guest's socket and pipe reaches a command
    assert code_root not in cmdline
    assert not ends & set(fds.split()), fds
    assert "socket" not in fds and fds.count("pipe:") == 1, fds
    # and the guest's environment (its first one was the zygote's) is not readable
    env = await h.bash(a, "cat /proc/$PPID/environ >/dev/null 2>&1 && echo READABLE || echo closed")
    assert env["stdout"] == "closed\n"


#: What the tenant does to the waiter first: stop it, or open a writer of the pipe it reads (its
#: own, through /proc) and keep it in a process of its own, so the pipe never ends.
TAMPERING = {
    "as is": "true",
    "stopped by the tenant": "kill -STOP 2",
    "its pipe held open by the tenant": (
        "n=$(tr '\\0' '\\n' < /proc/2/cmdline | sed -n 's|.*/proc/self/fd/||p'); "
        "(exec 9> /proc/2/fd/$n; sleep 300) > /dev/null 2>&1 & sleep 0.2"
    ),
}


@pytest.mark.parametrize("waiter", list(TAMPERING))
async def test_a_guest_that_exits_ends_its_sandbox(start_substrate: Start, waiter: str) -> None:
    # given a guest the tenant kills (its own uid may), after tampering with the waiter (which
    # would see the guest's pipe close) or not: the server watches the guest itself
    h = await start_substrate(slots=1, frozen_max=0, sandbox="bwrap")
    await h.actor("zg-x")
    a = await h.running("zg-x")
    await h.bash(a, "echo kept > f")
    await h.client.suspend_actor(ATESPACE, "zg-x")
    a = await h.running("zg-x")
    process = _process(h, "zg-x")
    assert process.guest is not None
    await h.bash(a, TAMPERING[waiter])
    os.kill(process.guest[0], signal.SIGKILL)

    # then the sandbox ends, its slot is freed, and the actor falls back to its snapshot
    await asyncio.wait_for(process.proc.wait(), 10)
    await _until(lambda: all(s.actor != "zg-x" for s in _control(h).slots.slots))
    again = await h.running("zg-x")
    assert (await h.bash(again, "cat f"))["output"] == "kept\n"


async def test_a_killed_zygote_is_started_again_and_running_guests_carry_on(start_substrate: Start) -> None:
    h = await start_substrate(slots=2, sandbox="bwrap")
    await h.actor("zg-1")
    one = await h.running("zg-1")
    zygote = _zygote(h)
    first = zygote.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await _until(lambda: zygote.pid is None)

    assert (await h.bash(one, "echo on"))["output"] == "on\n"
    await h.actor("zg-2")
    two = await h.running("zg-2")
    assert (await h.bash(two, "echo two"))["output"] == "two\n"
    assert zygote.pid not in (None, first)
    assert _process(h, "zg-2").guest is not None


async def test_a_zygote_that_cannot_start_guests_costs_none(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a zygote that exits at once (a kernel without setns on pidfds fails the same way)
    monkeypatch.setattr(zygote_module, "ZYGOTE_BOOT", "import sys; sys.exit(3)")
    h = await start_substrate(slots=1, sandbox="bwrap")
    await h.actor("zg-f")

    # then the guest runs its own interpreter in the same sandbox, and works
    a = await h.running("zg-f")
    assert _process(h, "zg-f").guest is None
    assert (await h.bash(a, "echo works"))["output"] == "works\n"
    assert (await h.client.suspend_actor(ATESPACE, "zg-f")).status is ActorStatus.SUSPENDED


async def test_a_guest_that_is_not_where_the_server_saw_its_sandbox_does_not_serve(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a server that saw one namespace of the sandbox fewer than the guest finds itself in
    # (as if the waiter had been swapped for another process between the two looks)
    monkeypatch.setattr(zygote_module, "NAMESPACES", {k: v for k, v in NAMESPACES.items() if k != "net"})
    h = await start_substrate(slots=1, sandbox="bwrap")
    await h.actor("zg-n")

    # then the guest exits before it serves, and the resume fails saying so
    with pytest.raises(Exception, match="exited"):
        await h.client.resume_actor(ATESPACE, "zg-n")
    logs = Path(h.config.state_dir) / "local-substrate" / "logs"
    assert "not in every namespace of its sandbox" in "".join(p.read_text() for p in logs.glob("slot-*.log"))
