"""Benchmark of the embedded local Substrate over real gRPC with real sandboxed guests.

Measures resume and suspend latency (p50/p99) for 1 MB and 50 MB workspaces, the first resume of
a template (golden-snapshot bake), and sessions cycled per second (resume, one command, suspend)
through N slots. Targets: warm resume p50 <= 150 ms and suspend p50 <= 250 ms at 1 MB. Also the
memory of N running sandboxes (PSS of all their processes, the guest zygote's included, after a
few calls each; reading it needs root, null otherwise).

Twice, in one run: with sandboxes never kept frozen (`frozen_max: 0`: every resume restores the
snapshot into a new sandbox; the figures without a prefix, comparable with earlier runs), then
with the shipped `frozen_max` (a resume continues the frozen sandbox: `frozen_*` figures, cycles
counted on each session's second round) and their ratio to the first. The frozen run also
measures the fleet's own parks (SuspendActor with `atefleet-park`: the frozen sandbox holds the
files, no snapshot is written): `frozen_park_*` figures, each with its resume (a thaw).

Run: .venv/bin/python bench/substrate.py [--slots 4] [--rounds 30] [--sessions 48] [--sandbox auto]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Running this file puts bench/ first on sys.path, where sibling scripts (bench/queue.py) would
# shadow standard modules; drop it before importing anything else.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from typing import Any  # noqa: E402

from common.config import Config, parse_config  # noqa: E402
from common.guest_client import GuestClient  # noqa: E402
from common.routing import LocalGuestRouter  # noqa: E402
from common.substrate import Actor, NoFreeWorkers, SubstrateClient, make_substrate_client  # noqa: E402
from local_substrate import frozen  # noqa: E402
from local_substrate.server import LocalSubstrate  # noqa: E402

ATESPACE = "bench"
TEMPLATE = "bench-tpl"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bash(config: Config, actor: Actor, command: str) -> dict[str, Any]:
    address = await LocalGuestRouter(config).address(actor)
    async with GuestClient(address, actor=actor.name) as guest:
        result, _ = await guest.run(uuid.uuid4().hex, "bash", {"command": command})
    return dict(result)


async def timed(call: Any) -> float:
    started = time.perf_counter()
    await call
    return (time.perf_counter() - started) * 1000


async def latency(
    config: Config, client: SubstrateClient, name: str, size_mb: int, rounds: int, park: bool = False
) -> dict[str, float]:
    await client.create_actor(ATESPACE, name, TEMPLATE)
    actor = await client.resume_actor(ATESPACE, name)
    await bash(config, actor, f"head -c {size_mb << 20} /dev/urandom > blob.bin")
    await client.suspend_actor(ATESPACE, name)
    resumes, suspends = [], []
    for _ in range(rounds):
        resumes.append(await timed(client.resume_actor(ATESPACE, name)))
        suspends.append(await timed(client.suspend_actor(ATESPACE, name, park=park)))
    return {
        "resume_p50": statistics.median(resumes),
        "resume_p99": pct(resumes, 0.99),
        "suspend_p50": statistics.median(suspends),
        "suspend_p99": pct(suspends, 0.99),
    }


async def cycle(config: Config, client: SubstrateClient, name: str, park: bool) -> None:
    while True:
        try:
            actor = await client.resume_actor(ATESPACE, name)
            break
        except NoFreeWorkers:
            await asyncio.sleep(0.005)
    await bash(config, actor, "echo x >> log.txt")
    await client.suspend_actor(ATESPACE, name, park=park)


def pss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


async def sandboxes_pss_mb(
    config: Config, client: SubstrateClient, server: LocalSubstrate, n: int
) -> float | None:
    """PSS of `n` running sandboxes (every process of each, and the zygote), after five calls each,
    in MB per sandbox; None where another process's smaps cannot be read (not root)."""
    control = server.control
    assert control is not None
    for i in range(n):
        await client.create_actor(ATESPACE, f"mem{i}", TEMPLATE)
        actor = await client.resume_actor(ATESPACE, f"mem{i}")
        for _ in range(5):
            await bash(config, actor, "true")
    pids = [p for s in control.slots.slots if s.process for p in frozen.tree(*s.process.roots())]
    pids += [control.zygote.pid] if control.zygote and control.zygote.pid else []
    try:
        total = sum(pss_kb(p) for p in pids)
    except PermissionError:
        return None
    finally:
        for i in range(n):
            await client.suspend_actor(ATESPACE, f"mem{i}")
    return round(total / 1024 / n, 1)


async def throughput(
    config: Config, client: SubstrateClient, sessions: int, slots: int, rounds: int, park: bool = False
) -> float:
    """Sessions cycled per second in the last of `rounds` rounds over `sessions` actors."""
    names = [f"{'p' if park else 't'}{i}" for i in range(sessions)]
    for n in names:
        await client.create_actor(ATESPACE, n, TEMPLATE)
    gate = asyncio.Semaphore(slots)

    async def one(n: str) -> None:
        async with gate:
            await cycle(config, client, n, park)

    for _ in range(rounds):
        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in names))
    return sessions / (time.perf_counter() - started)


@contextlib.asynccontextmanager
async def serving(
    slots: int, sandbox: str, frozen: bool
) -> AsyncIterator[tuple[Config, LocalSubstrate, SubstrateClient]]:
    """A local Substrate with the bench's template and atespace, and a client of it."""
    state = Path(tempfile.mkdtemp(prefix="lsbench-", dir="/tmp"))
    template = {"name": TEMPLATE, "setup": ["mkdir -p lib && head -c 65536 /dev/urandom > lib/seed.bin"]}
    local: dict[str, Any] = {"slots": slots, "sandbox": sandbox, "templates": [template]}
    if not frozen:
        local["frozen_max"] = 0
    config = parse_config({
        "state_dir": str(state),
        "environments": [{"name": "bench", "template": TEMPLATE, "atespace": ATESPACE}],
        "local_substrate": local,
    })  # fmt: skip
    server = LocalSubstrate(config, "127.0.0.1:0")
    await server.start()
    client = make_substrate_client(config, server.address)
    try:
        await client.create_atespace(ATESPACE)
        yield config, server, client
    finally:
        await client.close()
        await server.stop()
        shutil.rmtree(state, ignore_errors=True)


async def resume_p50_ms(rounds: int = 30, sandbox: str = "auto") -> float:
    """This bench's headline `resume_p50_ms_1mb` alone (a new sandbox each resume): the baseline
    bench/overcommit.py measures its wakes against in its own run."""
    async with serving(1, sandbox, frozen=False) as (config, _, client):
        return round((await latency(config, client, "one-mb", 1, rounds))["resume_p50"], 1)


async def run(args: argparse.Namespace, frozen: bool) -> dict[str, Any]:
    async with serving(args.slots, args.sandbox, frozen) as (config, server, client):
        await client.create_actor(ATESPACE, "golden", TEMPLATE)
        golden_ms = await timed(client.resume_actor(ATESPACE, "golden"))
        await client.suspend_actor(ATESPACE, "golden")
        small = await latency(config, client, "one-mb", 1, args.rounds)
        big = await latency(config, client, "fifty-mb", 50, max(5, args.rounds // 3))
        per_s = await throughput(config, client, args.sessions, args.slots, rounds=2 if frozen else 1)
        pss = None if frozen else await sandboxes_pss_mb(config, client, server, args.slots)
        parks: dict[str, float] = {}
        if frozen:
            small_park = await latency(config, client, "one-mb-park", 1, args.rounds, park=True)
            big_park = await latency(config, client, "fifty-mb-park", 50, max(5, args.rounds // 3), park=True)
            parks = {
                "park_p50_ms_1mb": round(small_park["suspend_p50"], 1),
                "park_resume_p50_ms_1mb": round(small_park["resume_p50"], 1),
                "park_p50_ms_50mb": round(big_park["suspend_p50"], 1),
                "park_resume_p50_ms_50mb": round(big_park["resume_p50"], 1),
                "parks_cycled_per_s": round(
                    await throughput(config, client, args.sessions, args.slots, rounds=2, park=True), 2
                ),
            }
    return {
        "resume_p50_ms_1mb": round(small["resume_p50"], 1),
        "resume_p99_ms_1mb": round(small["resume_p99"], 1),
        "suspend_p50_ms_1mb": round(small["suspend_p50"], 1),
        "suspend_p99_ms_1mb": round(small["suspend_p99"], 1),
        "resume_p50_ms_50mb": round(big["resume_p50"], 1),
        "resume_p99_ms_50mb": round(big["resume_p99"], 1),
        "suspend_p50_ms_50mb": round(big["suspend_p50"], 1),
        "suspend_p99_ms_50mb": round(big["suspend_p99"], 1),
        "golden_first_resume_ms": round(golden_ms, 1),
        "sessions_cycled_per_s": round(per_s, 2),
        "sandbox_pss_mb": pss,
        "slots": args.slots,
        "sandbox": server.level,
        **parks,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--sessions", type=int, default=48)
    p.add_argument("--sandbox", default="auto", choices=["auto", "bwrap", "unshare", "none"])
    args = p.parse_args()
    figures = asyncio.run(run(args, frozen=False))
    frozen = asyncio.run(run(args, frozen=True))
    for key in ("resume_p50_ms_1mb", "resume_p99_ms_1mb", "suspend_p50_ms_1mb", "suspend_p99_ms_1mb",
                "resume_p50_ms_50mb", "suspend_p50_ms_50mb", "sessions_cycled_per_s"):
        figures[f"frozen_{key}"] = frozen[key]
        figures[f"frozen_{key}_ratio"] = round(frozen[key] / figures[key], 3) if figures[key] else None
    figures.update({f"frozen_{k}": v for k, v in frozen.items() if k.startswith("park")})
    print(f"sandbox: {figures['sandbox']}, slots: {figures['slots']}")
    for size in ("1mb", "50mb"):
        f = {k.replace(f"_ms_{size}", ""): v for k, v in figures.items() if k.endswith(f"_ms_{size}")}
        print(f"{size:>5}: resume p50 {f['resume_p50']} ms, p99 {f['resume_p99']} ms;"
              f" suspend p50 {f['suspend_p50']} ms, p99 {f['suspend_p99']} ms")  # fmt: skip
    print(f"golden first resume: {figures['golden_first_resume_ms']} ms")
    print(f"sessions cycled: {figures['sessions_cycled_per_s']}/s; "
          f"memory per running sandbox (PSS): {figures['sandbox_pss_mb']} MB")
    f = {k.removeprefix("frozen_"): v for k, v in figures.items() if k.startswith("frozen_")}
    print(f"frozen: resume p50 {f['resume_p50_ms_1mb']} ms (1 MB), {f['resume_p50_ms_50mb']} ms (50 MB);"
          f" suspend p50 {f['suspend_p50_ms_1mb']} ms; cycled {f['sessions_cycled_per_s']}/s")  # fmt: skip
    print(f"parks: {f['park_p50_ms_1mb']} ms (1 MB), {f['park_p50_ms_50mb']} ms (50 MB), their resumes"
          f" {f['park_resume_p50_ms_1mb']} / {f['park_resume_p50_ms_50mb']} ms;"
          f" cycled {f['parks_cycled_per_s']}/s")  # fmt: skip
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
