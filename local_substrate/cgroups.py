"""Per-slot cgroups (v1 pids+memory(+cpu), else v2) when the hierarchy is writable; else none.

A sandbox joins its cgroup before it execs (the launcher's wrapper writes its own pid into
`cgroup.procs`), so not even its first fork escapes the limits. The rlimits the launcher always
sets stay the first line of defence; cgroups add a whole-tree pid cap and a memory cap that
counts tmpfs and page cache.

All sandboxes of this server share one CPU weight (`local_substrate.sandbox_cpu_weight`, on the
common parent group; slots split it equally). On one host the fleet's own processes and tenant
code compete for the same cores: with a low weight, a CPU-bound tool call cannot starve the API,
the workers or Redis (as on Substrate proper, where actors run on other nodes), and a burst of
submissions is accepted at once and queued rather than slowed to the pace of execution. The
weight only matters while the CPU is contended; an idle host gives sandboxes all of it.
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

    def __init__(self, tag: str, cpu_weight: int = 100) -> None:
        self.mode = _detect()
        self._tag = f"atefleet-{tag}"
        #: cgroup v2 `cpu.weight` semantics: 100 = one ordinary process's share.
        self.cpu_weight = cpu_weight

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
            return SlotCgroup((pids_dir, mem_dir, *self._v1_cpu(slot)))
        if self.mode == "v2":
            parent = CGROUP_ROOT / self._tag
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", "+pids +memory")
            self._v2_cpu(parent)
            d = parent / slot
            d.mkdir(exist_ok=True)
            _write(d / "pids.max", str(max_pids))
            _write(d / "memory.max", mem)
            _write(d / "memory.swap.max", "0")
            return SlotCgroup((d,))
        return None

    def _v1_cpu(self, slot: str) -> tuple[Path, ...]:
        """The slot's dir under the shared, weighted parent of the v1 cpu controller (none if absent)."""
        parent = CGROUP_ROOT / "cpu" / self._tag
        if not os.access(CGROUP_ROOT / "cpu", os.W_OK):
            return ()
        (parent / slot).mkdir(parents=True, exist_ok=True)
        # v1 shares: 1024 is one ordinary process, as weight 100 is in v2.
        _write(parent / "cpu.shares", str(max(2, self.cpu_weight * 1024 // 100)))
        return (parent / slot,)

    def _v2_cpu(self, parent: Path) -> None:
        try:
            _write(parent / "cgroup.subtree_control", "+cpu")
        except OSError:
            return  # the cpu controller is not delegated here: no weight
        _write(parent / "cpu.weight", str(self.cpu_weight))

    def remove_all(self) -> None:
        """Remove this server's cgroup dirs (empty ones only; the kernel refuses others)."""
        tops = [CGROUP_ROOT / c / self._tag for c in ("pids", "memory", "cpu")] + [CGROUP_ROOT / self._tag]
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
