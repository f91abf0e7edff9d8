"""Frozen sandboxes: a suspended actor's processes kept stopped in memory, for a resume in place.

Starting a sandbox and its guest is most of a resume's cost, in time and in CPU (the interpreter
and the guest's imports), and with far more sessions than slots the fleet parks and resumes on
nearly every call. So a suspend may keep the actor's sandbox as it is, every process stopped
(SIGSTOP, which nothing in the sandbox can catch or undo: every process that could send SIGCONT
is stopped too, and no other sandbox sees its pids), and a later resume of the same actor only
continues them. A stopped sandbox uses no CPU and holds no slot; it holds its memory and its
home (dirs and uid).

A client's suspend still writes the snapshot, while the tree is stopped (so nothing writes
during it): it stays the durable copy, restored by a resume that finds no frozen sandbox (one
evicted to make room, killed by the host, or lost with a server restart). The fleet's own parks
write none: the frozen sandbox's slot holds the files until one is needed, and every way that
sandbox ends writes them first (control.py, "Held files").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

#: Walks of the tree before giving up: each stops every process it finds, and a stopped process
#: cannot fork, so a walk finds only what was forked before its parent stopped.
MAX_ROUNDS = 64
#: States of a process that runs no more code: stopped, traced, zombie, dead, or gone.
STOPPED_STATES = frozenset({"T", "t", "Z", "X", ""})
#: Pause while processes that were sent SIGSTOP have not stopped yet, and the longest wait.
STOP_POLL_S = 0.0005
STOP_TIMEOUT_S = 5.0


def _read(path: str) -> bytes:
    """The whole of a /proc file, b"" once it (or its process) is gone. Raw reads, not pathlib:
    a freeze reads a few of these per process, on the event loop, at every park."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return data
    except OSError:
        return b""
    finally:
        os.close(fd)


def _children(pid: int) -> list[int]:
    """Children of every thread of `pid` (a child belongs to the thread that forked it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        out += map(int, _read(f"/proc/{pid}/task/{tid}/children").split())
    return out


def tree(*roots: int) -> list[int]:
    """`roots` and every descendant, parents before children."""
    seen = list(roots)
    known = set(roots)
    i = 0
    while i < len(seen):
        for child in _children(seen[i]):
            if child not in known:
                known.add(child)
                seen.append(child)
        i += 1
    return seen


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...), "" once it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3].decode() if end >= 0 else ""


async def freeze(*roots: int) -> bool:
    """SIGSTOP the whole trees of `roots`, top down, until every process found has stopped and a last
    walk finds no other. A process sent SIGSTOP runs no more user code, but a fork already inside
    the kernel completes, and one of the tree not stopped yet may SIGCONT another (it is stopped
    again): only once all show stopped can the tree neither grow nor wake. False when it kept
    growing for MAX_ROUNDS walks or did not stop within STOP_TIMEOUT_S (kill it instead).

    On the event loop, not in a thread: a walk of a sandbox's few processes costs less than
    handing it to a thread (and the GIL back), and every wait yields to the loop. A tree as large
    as the tenant's process limit allows yields between its walks as well."""
    stopped: set[int] = set()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for _ in range(MAX_ROUNDS):
        fresh = [p for p in tree(*roots) if p not in stopped]
        for pid in fresh:
            _signal(pid, signal.SIGSTOP)
            stopped.add(pid)
        if fresh:
            # A process stops once it is next scheduled: looked at at once, nearly all still show
            # running, and each would be sent SIGSTOP again for nothing.
            await asyncio.sleep(STOP_POLL_S)
        while running := [p for p in stopped if _state(p) not in STOPPED_STATES]:
            if time.monotonic() > deadline:
                return False
            for pid in running:  # not stopped yet, or continued by a process not stopped yet
                _signal(pid, signal.SIGSTOP)
            await asyncio.sleep(STOP_POLL_S)
        if not fresh:
            return True
        await asyncio.sleep(0)
    return False


def thaw(*roots: int) -> None:
    """SIGCONT the whole trees of `roots`."""
    for pid in tree(*roots):
        _signal(pid, signal.SIGCONT)


def mem_available_bytes() -> int:
    """The kernel's estimate of memory available for new work (MemAvailable)."""
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0
