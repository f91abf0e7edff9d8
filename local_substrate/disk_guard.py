"""The disk guard: a running tenant cannot fill the disk that holds the snapshots (and Redis's AOF).

A workspace is a plain dir on the host (it must be, to be snapshotted from outside the sandbox),
bounded per file by RLIMIT_FSIZE and as a whole only when a suspend snapshots it. Between
suspends, this guard reads the free space of the state dir's filesystem every
`disk_check_period_s` (one statvfs). Only while less than `disk_reserve_mb` is free does it
measure each RUNNING slot's workspace and guest state (`snapshots.measure`: lstats only, off the
event loop, one slot at a time) against its template's snapshot limits, and stop every slot over
one (`Control.stop_over_quota`: killed, back at its last snapshot, its files deleted at once).
That actor's next resume is refused once with the reason (RESOURCE_EXHAUSTED "workspace over
quota: ..."; the fleet answers 507 `workspace_over_quota`). A slot within its limits is never
touched: a breach costs only the session that made it its work since its last snapshot.

A tenant could keep moving a dir so that no walk of its tree finishes (`trees.TreeChanged`):
such a workspace cannot be shown within its limits, so after UNMEASURED_PASSES low-disk passes in
a row that could not measure it, its slot is stopped as well.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from local_substrate.control import Control
from local_substrate.slots import Slot
from local_substrate.snapshots import SnapshotLimits, SnapshotRefused, measure
from local_substrate.store import ActorRecord
from local_substrate.trees import TreeChanged

log = logging.getLogger(__name__)

#: Low-disk passes in a row whose walk of a slot's tree was cut short by a moving dir before that
#: slot is stopped as unmeasurable.
UNMEASURED_PASSES = 3


@dataclass
class GuardStats:
    """What the guard did since it started (tests and bench/disk_guard.py read it)."""

    #: Free-space reads (one statvfs each).
    checks: int = 0
    #: Checks that found less than the reserve free (each measures the running slots).
    low: int = 0
    #: Slot measurements.
    measured: int = 0
    #: Slots stopped.
    stopped: int = 0


class DiskGuard:
    """Started and stopped by the server with its Control; `reserve_mb` 0 turns it off."""

    def __init__(self, control: Control, path: Path, reserve_mb: int, period_s: float) -> None:
        self._control = control
        self._path = path
        self._reserve = reserve_mb << 20
        self._period_s = period_s
        self.stats = GuardStats()
        #: run id → low-disk passes in a row that could not measure that run's tree.
        self._unmeasured: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._reserve and self._task is None:
            self._task = asyncio.create_task(self._run(), name="disk-guard")

    async def stop(self) -> None:
        """Cancel the loop (a measurement already in its thread finishes there: it only reads)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            try:
                await self.check()
            except Exception:
                log.exception("disk guard: pass failed; trying again next period")

    def free_bytes(self) -> int:
        st = os.statvfs(self._path)
        return st.f_bavail * st.f_frsize

    async def check(self) -> None:
        """One pass: read the free space; below the reserve, measure and stop what is over."""
        self.stats.checks += 1
        free = self.free_bytes()
        if free >= self._reserve:
            self._unmeasured.clear()
            return
        self.stats.low += 1
        # Frozen sandboxes' files are a second copy of their snapshots: the first space to free.
        await self._control.evict_frozen()
        running = self._control.running()
        # Counts of runs no longer running go: a run id is never reused.
        self._unmeasured = {rec.run_id: self._unmeasured.get(rec.run_id, 0) for _, rec in running}
        for slot, rec in running:
            breach = await self._breach(slot, rec)
            if breach and await self._control.stop_over_quota(slot, rec, self._reason(free, breach)):
                self.stats.stopped += 1

    async def _breach(self, slot: Slot, rec: ActorRecord) -> str:
        """Why the slot must stop ("" when within its limits, or not measured this pass)."""
        limits = SnapshotLimits.of(self._control.template(rec).limits)
        self.stats.measured += 1
        try:
            await asyncio.to_thread(measure, slot.dirs.snapshot_sources(), limits)
        except SnapshotRefused as err:
            return str(err)
        except TreeChanged:
            self._unmeasured[rec.run_id] += 1
            if self._unmeasured[rec.run_id] >= UNMEASURED_PASSES:
                return f"its files kept moving under {UNMEASURED_PASSES} measurements in a row"
            return ""
        except OSError as err:
            log.warning("disk guard: cannot measure %s in %s: %s", rec.name, slot.name, err)
            return ""
        self._unmeasured[rec.run_id] = 0
        return ""

    def _reason(self, free: int, breach: str) -> str:
        return (
            f"with {free >> 20} MB of the host's disk free (under the {self._reserve >> 20} MB reserve), "
            f"its files were over the template's limits: {breach}"
        )
