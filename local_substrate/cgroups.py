"""Per-slot cgroups (v1 pids+memory, else v2) when the hierarchy is writable; else none.

A sandbox joins its cgroup before it execs (the launcher's wrapper writes its own pid into
`cgroup.procs`), so not even its first fork escapes the limits. The rlimits the launcher always
sets stay the first line of defence; cgroups add a whole-tree pid cap and a memory cap that
counts tmpfs and page cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Longest wait for a killed sandbox's processes to be gone, seconds.
EMPTY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SlotCgroup:
    """The cgroup dirs of one slot (one per v1 controller, or one v2 dir)."""

    dirs: tuple[Path, ...]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def kill_all(self) -> None:
        """SIGKILL every process still in the cgroup (the last sweep after a sandbox stops)."""
        for d in self.dirs:
            for pid in _pids(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    async def wait_empty(self, timeout_s: float = EMPTY_TIMEOUT_S) -> None:
        """Until every killed process has exited, so the slot's next actor starts clean."""
        deadline = time.monotonic() + timeout_s
        while any(_pids(d) for d in self.dirs) and time.monotonic() < deadline:
            self.kill_all()
            await asyncio.sleep(0.005)


def _pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class Cgroups:
    """Creates slot cgroups under `atefleet-<tag>/` of whichever hierarchy is writable."""

    def __init__(self, tag: str) -> None:
        self.mode = _detect()
        self._tag = f"atefleet-{tag}"

    def make(self, slot: str, memory_mb: int, max_pids: int) -> SlotCgroup | None:
        try:
            return self._make(slot, memory_mb, max_pids)
        except OSError as err:
            log.warning("cgroup for %s unavailable (%s): rlimits only", slot, err)
            return None

    def _make(self, slot: str, memory_mb: int, max_pids: int) -> SlotCgroup | None:
        mem = str(memory_mb << 20)
        if self.mode == "v1":
            pids_dir = CGROUP_ROOT / "pids" / self._tag / slot
            mem_dir = CGROUP_ROOT / "memory" / self._tag / slot
            pids_dir.mkdir(parents=True, exist_ok=True)
            mem_dir.mkdir(parents=True, exist_ok=True)
            _write(pids_dir / "pids.max", str(max_pids))
            _write(mem_dir / "memory.limit_in_bytes", mem)
            return SlotCgroup((pids_dir, mem_dir))
        if self.mode == "v2":
            parent = CGROUP_ROOT / self._tag
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", "+pids +memory")
            d = parent / slot
            d.mkdir(exist_ok=True)
            _write(d / "pids.max", str(max_pids))
            _write(d / "memory.max", mem)
            _write(d / "memory.swap.max", "0")
            return SlotCgroup((d,))
        return None

    def remove_all(self) -> None:
        """Remove this server's cgroup dirs (empty ones only; the kernel refuses others)."""
        tops = [CGROUP_ROOT / c / self._tag for c in ("pids", "memory")] + [CGROUP_ROOT / self._tag]
        for top in tops:
            if top.is_dir():
                for child in top.iterdir():
                    if child.is_dir():
                        _rmdir(child)
                _rmdir(top)


def _rmdir(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


def _detect() -> str:
    """ "v1" if the pids and memory controllers are mounted writable, "v2" if a writable unified
    hierarchy offers both, else "none"."""
    v1 = [CGROUP_ROOT / "pids", CGROUP_ROOT / "memory"]
    if all(d.is_dir() and os.access(d, os.W_OK) for d in v1):
        return "v1"
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists() and os.access(CGROUP_ROOT, os.W_OK):
        have = controllers.read_text().split()
        if "pids" in have and "memory" in have:
            return "v2"
    return "none"
