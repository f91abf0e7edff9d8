"""Golden snapshots: a template's setup commands, run once in a sandbox, baked into a snapshot.

A new actor (no snapshot of its own) starts from its template's golden snapshot. Baking runs the
template's `setup` commands (`sh -ec`, in order, in /workspace) in a sandbox with the template's
network and limits, then snapshots the workspace. The golden file's name carries a hash of the
setup, so editing a template's setup bakes a new one (and deletes the old one). The first resume
of a template therefore is slow (it waits for the bake) and says so in the log; later resumes
restore the file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from pathlib import Path

from common.config import TemplateConfig
from local_substrate.cgroups import Cgroups
from local_substrate.guests import sandbox_spec
from local_substrate.layout import Layout
from local_substrate.sandbox import start_sandbox
from local_substrate.slots import SlotDirs, UidBlock
from local_substrate.snapshots import SnapshotLimits, SnapshotRefused, write_snapshot
from local_substrate.trees import remove_tree

log = logging.getLogger(__name__)

#: Longest a template's setup may run, seconds.
BAKE_TIMEOUT_S = 900.0


class BakeError(Exception):
    pass


def golden_path(layout: Layout, template: TemplateConfig) -> Path:
    recipe = json.dumps({"setup": template.setup, "network": template.network}, sort_keys=True)
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    return layout.golden / f"{template.name}-{digest}.tar.zst"


class GoldenSnapshots:
    def __init__(self, layout: Layout, level: str, cgroups: Cgroups, uids: UidBlock) -> None:
        self._layout = layout
        self._uids = uids
        self._level = level
        self._cgroups = cgroups
        self._locks: dict[str, asyncio.Lock] = {}
        #: Seconds the last bake of each template took (reported in logs and by tests/bench).
        self.bake_seconds: dict[str, float] = {}

    async def path(self, template: TemplateConfig, skills: tuple[tuple[Path, str], ...]) -> Path:
        """The template's golden snapshot, baking it first if there is none yet."""
        target = golden_path(self._layout, template)
        lock = self._locks.setdefault(template.name, asyncio.Lock())
        async with lock:
            if not target.exists():
                log.warning(
                    "template %s: first resume, baking its golden snapshot (this resume is slow)",
                    template.name,
                )
                started = time.monotonic()
                await self._bake(template, skills, target)
                self.bake_seconds[template.name] = time.monotonic() - started
                log.warning("template %s: golden snapshot baked in %.1f s", template.name,
                            self.bake_seconds[template.name])  # fmt: skip
        return target

    async def _bake(
        self, template: TemplateConfig, skills: tuple[tuple[Path, str], ...], target: Path
    ) -> None:
        base = self._layout.bake / template.name
        dirs = SlotDirs(base, base / "sock", self._uids.first)
        dirs.reset()
        try:
            if template.setup:
                await self._run_setup(template, skills, dirs)
            dropped = await asyncio.to_thread(
                write_snapshot, target, dirs.snapshot_sources(), SnapshotLimits.of(template.limits)
            )
        except SnapshotRefused as err:
            raise BakeError(f"template {template.name}: setup left a workspace over limits: {err}") from err
        finally:
            await asyncio.to_thread(remove_tree, str(base))
        if dropped:
            log.warning("template %s: special files left out of its golden snapshot: %s",
                        template.name, dropped)  # fmt: skip
        self._remove_older(template, target)

    def _remove_older(self, template: TemplateConfig, current: Path) -> None:
        """Delete the template's golden snapshots of earlier setups: nothing restores them again."""
        for p in self._layout.golden.glob(f"{template.name}-*.tar.zst"):
            if p != current and re.fullmatch(rf"{re.escape(template.name)}-[0-9a-f]{{16}}\.tar\.zst", p.name):
                log.info("template %s: deleting its earlier setup's golden snapshot %s", template.name, p)
                p.unlink(missing_ok=True)

    def collect(self, templates: list[TemplateConfig]) -> None:
        """After a restart: delete every golden file that is not the current one of a template
        (templates removed or changed while the server was down, temp files of cut bakes)."""
        current = {golden_path(self._layout, t) for t in templates}
        for p in self._layout.golden.iterdir():
            if p not in current:
                log.info("deleting a golden snapshot no template uses: %s", p)
                p.unlink(missing_ok=True)

    async def _run_setup(
        self, template: TemplateConfig, skills: tuple[tuple[Path, str], ...], dirs: SlotDirs
    ) -> None:
        spec = sandbox_spec(self._layout, self._cgroups, f"bake-{template.name}", dirs, template, skills)
        script = "\n".join(template.setup)
        process = await start_sandbox(self._level, spec, ["sh", "-ec", script])
        try:
            rc = await asyncio.wait_for(process.proc.wait(), timeout=BAKE_TIMEOUT_S)
        except TimeoutError:
            raise BakeError(f"template {template.name}: setup ran over {BAKE_TIMEOUT_S:.0f} s") from None
        finally:
            await process.reap()
        if rc != 0:
            raise BakeError(
                f"template {template.name}: setup failed with exit status {rc} (see {spec.log_path})"
            )
