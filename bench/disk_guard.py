"""Benchmark of the local Substrate's disk guard: its cost with the disk fine, and one low-disk pass.

With the disk fine a check is one statvfs: its CPU is measured over many checks of a started
local Substrate's guard. A low-disk pass measures every running slot's workspace in turn, off the
event loop (`snapshots.measure`, lstats only); here each of `--slots` slot dirs is filled with a
workspace of `--files` files in `--dirs` dirs (`--mb` MB in all) and the pass is timed as the
guard runs it (one slot after another, each in a thread), warm page cache.

Run: .venv/bin/python bench/disk_guard.py [--slots 8] [--files 2000] [--dirs 200] [--mb 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Running this file puts bench/ first on sys.path, where sibling scripts (bench/queue.py) would
# shadow standard modules; drop it before importing anything else.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from common.config import parse_config  # noqa: E402
from local_substrate.server import LocalSubstrate  # noqa: E402
from local_substrate.snapshots import SnapshotLimits, measure  # noqa: E402
from local_substrate.trees import remove_tree  # noqa: E402

#: Checks timed for the disk-fine figure.
CHECKS = 20_000
#: Low-disk passes timed.
PASSES = 7


def fill(workspace: Path, files: int, dirs: int, total_mb: int) -> None:
    size = (total_mb << 20) // files
    data = b"x" * size
    for i in range(files):
        d = workspace / f"d{i % dirs}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}").write_bytes(data)


async def run(args: argparse.Namespace, root: Path) -> dict[str, float]:
    config = parse_config(
        {"state_dir": str(root), "local_substrate": {"slots": args.slots, "disk_reserve_mb": 1}}
    )
    server = LocalSubstrate(config, "127.0.0.1:0")
    await server.start()
    try:
        assert server.disk_guard is not None and server.control is not None
        guard, slots = server.disk_guard, server.control.slots.slots[: args.slots]
        cpu = time.process_time()
        for _ in range(CHECKS):
            await guard.check()
        check_us = (time.process_time() - cpu) / CHECKS * 1e6
        for slot in slots:
            slot.dirs.prepare()  # as a resume leaves it (a slot never used has no dirs yet)
            fill(slot.dirs.workspace, args.files, args.dirs, args.mb)
        limits = SnapshotLimits.of(config.template("bench").limits)
        walls, cpus = [], []
        for _ in range(PASSES):
            wall, cpu = time.perf_counter(), time.process_time()
            for slot in slots:  # as DiskGuard.check: one slot after another, each in a thread
                await asyncio.to_thread(measure, slot.dirs.snapshot_sources(), limits)
            walls.append((time.perf_counter() - wall) * 1000)
            cpus.append((time.process_time() - cpu) * 1000)
    finally:
        await server.stop()
    return {
        "check_cpu_us": round(check_us, 2),
        "idle_cpu_share_at_2s": round(check_us / 2e6, 9),
        "pass_ms_p50": round(statistics.median(walls), 1),
        "pass_ms_max": round(max(walls), 1),
        "pass_cpu_ms_p50": round(statistics.median(cpus), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--dirs", type=int, default=200)
    parser.add_argument("--mb", type=int, default=20)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-dg-", dir="/tmp"))
    try:
        figures = asyncio.run(run(args, root))
    finally:
        remove_tree(str(root))
    print(f"disk fine: {figures['check_cpu_us']} us CPU per check (one statvfs)")
    shape = f"{args.files} files / {args.dirs} dirs / {args.mb} MB"
    print(
        f"disk low: one pass over {args.slots} slots of {shape}: p50 {figures['pass_ms_p50']} ms "
        f"(max {figures['pass_ms_max']}), CPU {figures['pass_cpu_ms_p50']} ms"
    )
    print(json.dumps({"bench": "disk_guard", **vars(args), **figures}))


if __name__ == "__main__":
    main()
