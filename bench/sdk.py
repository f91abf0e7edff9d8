"""SDK benchmark: the Python SDK (`atefleet.client`) against bench/e2e.py's minimal client, and the
HTTP clients it was chosen over, on one fleet in one run.

Starts the fleet as bench/e2e.py does (shipped worker defaults, 110 actor slots), resumes 100
sessions, writes a 1 KiB file in each, then measures over real HTTP on loopback:

1. throughput: 100 sessions x `--calls` sequential sync `read_file` calls from 100 concurrent
   tasks, in interleaved rounds (so machine noise hits all alike), through
   - `minimal`: bench/e2e.py's keep-alive client (one connection per task),
   - `sdk`: one `AsyncClient`, `client.session(env, sid).read_file(path)` (typed result, an
     Idempotency-Key per call),
   - `httpx`: one tuned `httpx.AsyncClient` (HTTP/1.1, 256 pooled connections, raw JSON),
   - `aiohttp`: one `aiohttp.ClientSession` (unlimited connector, raw JSON);
   with the client's CPU per call. Target: sdk >= 80% of minimal.
2. latency: one session, sequential `read_file`, interleaved: minimal vs the sync `Client` vs
   `AsyncClient`. Target: sync SDK p50 <= minimal p50 + 0.2 ms.
3. fan-out: 1,000 async `read_file` jobs (10 per session), each submit pattern through both
   clients, in interleaved rounds: one POST per job (per session in order) and one
   `POST /v1/jobs:batch`. The minimal client runs bench/async.py's phases (it long-polls only each
   session's last job); the SDK submits its idiomatic way (`session.submit`, `client.batch`) and
   collects every job with `AsyncClient.as_completed`. Completions/s from the jobs' own
   timestamps (first `created_at` to last `finished_at`), so slow submits count too.

    .venv/bin/python bench/sdk.py [--calls 20] [--rounds 2] [--n 300]

The last line is one JSON object of figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py is named like the stdlib `queue`: keep bench/ off the path, the repo root first.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Awaitable, Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import aiohttp  # noqa: E402

from atefleet.client import AsyncClient, Client, Job  # noqa: E402
from bench.e2e import (  # noqa: E402
    ENV,
    READ_SMALL,
    SMALL_FILE,
    WRITE_SMALL,
    Conn,
    async_client,
    at_start_line,
    fleet_call,
    fleet_config,
    load_average,
    p50,
    pct,
    session_path,
    throughput,
    timed_ms,
)
from tests.e2e.conftest import RunningFleet, start_fleet  # noqa: E402

#: bench/async.py (a module name no import statement can spell): its completion phase and figures.
bench_async = importlib.import_module("bench.async")

TARGET_RATIO = 0.8
TARGET_SYNC_ADDED_MS = 0.2

Call = Callable[[], Awaitable[None]]


async def clocked(sids: list[str], make_call: Callable[[str], Call], calls: int) -> dict[str, float]:
    """Each session's task makes `calls` sequential calls; calls/s and client CPU ms per call."""
    async def session(sid: str) -> None:
        call = make_call(sid)
        await at_start_line(start, call())
        await timed_ms(call, calls)

    start = asyncio.Barrier(len(sids) + 1)
    tasks = [asyncio.create_task(session(s)) for s in sids]
    await start.wait()
    cpu0, began = time.process_time(), time.perf_counter()
    await asyncio.gather(*tasks)
    n = len(sids) * calls
    elapsed_s, cpu_s = time.perf_counter() - began, time.process_time() - cpu0
    return {"per_s": n / elapsed_s, "client_cpu_ms": cpu_s * 1000 / n}


@contextmanager
def fleet_without_idle_suspend(slots: int = 110) -> Iterator[RunningFleet]:
    """bench/e2e.py's fleet, except sessions are never suspended for idleness: on a loaded machine
    resuming 100 sessions can outlast the e2e config's idle timeout."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-sdk-"))
    cfg = fleet_config(tmp, slots)
    cfg["environments"][0]["idle_timeout_s"] = 0
    fleet: RunningFleet | None = None
    try:
        fleet = start_fleet(tmp, cfg)
        yield fleet
    finally:
        if fleet is not None:
            fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def resume_sessions(fleet: RunningFleet, sids: list[str], parallel: int = 25) -> float:
    """Resume every session through the SDK (which follows a resume that outlasts the API's sync
    wait, as one does on a loaded machine); seconds taken."""
    gate = asyncio.Semaphore(parallel)
    async with AsyncClient(fleet.url) as client:
        async def one(sid: str) -> None:
            async with gate:
                await client.session(ENV, sid).resume()

        began = time.perf_counter()
        await asyncio.gather(*(one(s) for s in sids))
        return time.perf_counter() - began


def sdk_call(client: AsyncClient, sid: str) -> Call:
    session = client.session(ENV, sid)

    async def call() -> None:
        if (await session.read_file(SMALL_FILE)).is_error:
            raise RuntimeError("read_file failed through the SDK")

    return call


def raw_call(post: Callable[[str], Awaitable[dict[str, Any]]], sid: str) -> Call:
    path = session_path(sid)

    async def call() -> None:
        if (await post(path)).get("is_error"):
            raise RuntimeError("read_file failed")

    return call


async def throughput_rounds(fleet: RunningFleet, sids: list[str], calls: int, rounds: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, float]]] = {"minimal": [], "sdk": [], "httpx": [], "aiohttp": []}
    async with AsyncClient(fleet.url) as sdk, async_client(fleet) as hx, \
            aiohttp.ClientSession(fleet.url, connector=aiohttp.TCPConnector(limit=0)) as aio:
        async def hx_post(path: str) -> dict[str, Any]:
            return dict((await hx.post(path, json=READ_SMALL)).json())

        async def aio_post(path: str) -> dict[str, Any]:
            async with aio.post(path, json=READ_SMALL) as r:
                return dict(await r.json())

        for _ in range(rounds):
            tp = await throughput(fleet, sids, calls, READ_SMALL)
            results["minimal"].append({"per_s": tp["per_s"], "client_cpu_ms": tp["client_cpu_ms"]})
            results["sdk"].append(await clocked(sids, lambda s: sdk_call(sdk, s), calls))
            results["httpx"].append(await clocked(sids, lambda s: raw_call(hx_post, s), calls))
            results["aiohttp"].append(await clocked(sids, lambda s: raw_call(aio_post, s), calls))
    return {name: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for name, rs in results.items()}


async def latency(fleet: RunningFleet, n: int) -> dict[str, list[float]]:
    sid = f"lat-{uuid.uuid4().hex[:8]}"
    await resume_sessions(fleet, [sid])
    conn = await Conn.tcp(fleet.url)
    await fleet_call(conn, sid, WRITE_SMALL)()
    await conn.close()
    with Client(fleet.url) as sync_client:
        async with AsyncClient(fleet.url) as async_sdk:
            sync_session, async_session = sync_client.session(ENV, sid), async_sdk.session(ENV, sid)

            async def sync_sdk() -> None:
                sync_session.read_file(SMALL_FILE)

            async def async_sdk_call() -> None:
                await async_session.read_file(SMALL_FILE)

            samples: dict[str, list[float]] = {"minimal": [], "sdk_sync": [], "sdk_async": []}
            for round_n in range(4):  # the first round warms up
                # A connection per round: on a loaded machine a round can outlast the API's
                # keep-alive timeout for an idle one (the SDK reconnects by itself).
                conn = await Conn.tcp(fleet.url)
                paths = {"minimal": fleet_call(conn, sid, READ_SMALL), "sdk_sync": sync_sdk,
                         "sdk_async": async_sdk_call}
                for name, fn in paths.items():
                    took = await timed_ms(fn, n // 3)
                    if round_n:
                        samples[name] += took
                await conn.close()
    return samples


async def sdk_fan_out(fleet: RunningFleet, sids: list[str], per_session: int,
                      batch: bool) -> dict[str, float]:
    """`per_session` read_file jobs per session submitted through the SDK, then collected with
    `as_completed`. `batch`: one `client.batch` (session-interleaved, like bench/async.py's batch
    phase); else per session in order, one `session.submit` each (like its submit phase)."""
    async with AsyncClient(fleet.url) as client:
        began = time.perf_counter()
        if batch:
            jobs = await client.batch([{"environment": ENV, "session": sid, **READ_SMALL}
                                       for _ in range(per_session) for sid in sids])
        else:
            async def submit(sid: str) -> list[Job]:
                session = client.session(ENV, sid)
                return [await session.submit("read_file", {"path": SMALL_FILE}) for _ in range(per_session)]

            jobs = [j for js in await asyncio.gather(*(submit(s) for s in sids)) for j in js]
        submit_per_s = len(jobs) / (time.perf_counter() - began)
        done = [job async for job in client.as_completed(jobs)]
    if any(j.state != "succeeded" for j in done) or len(done) != len(jobs):
        raise RuntimeError("as_completed: not every job succeeded")
    return {"submit_per_s": submit_per_s, **bench_async.completion_figures([j.model_dump() for j in done])}


async def fan_out_rounds(fleet: RunningFleet, sids: list[str], per_session: int,
                         rounds: int) -> dict[str, dict[str, float]]:
    """Each submit pattern through the minimal client (bench/async.py's phases, which long-poll
    only each session's last job) and through the SDK (`as_completed` over every job), in
    interleaved rounds so machine noise hits all alike; the mean of each one's rounds."""
    everything = len(sids) * per_session  # in one batch
    phases: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "minimal_one_post": lambda: bench_async.submit_phase(fleet, sids, per_session),
        "sdk_one_post": lambda: sdk_fan_out(fleet, sids, per_session, batch=False),
        "minimal_batch": lambda: bench_async.batch_phase(fleet, sids, per_session, batch=everything),
        "sdk_batch": lambda: sdk_fan_out(fleet, sids, per_session, batch=True),
    }
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in phases}
    for _ in range(rounds):
        for name, phase in phases.items():
            figures[name].append(await phase())
    return {name: {k: sum(r[k] for r in rs) / rounds for k in ("submit_per_s", "per_s", "p50")}
            for name, rs in figures.items()}


async def run(args: argparse.Namespace) -> dict[str, float]:
    print(f"load average at start: {load_average()}")
    with fleet_without_idle_suspend() as fleet:
        sids = [f"sdk-{i}-{uuid.uuid4().hex[:8]}" for i in range(args.sessions)]
        print(f"resumed {args.sessions} sessions in {await resume_sessions(fleet, sids):.1f} s")
        await throughput(fleet, sids, 1, WRITE_SMALL)
        lat = await latency(fleet, args.n)
        tp = await throughput_rounds(fleet, sids, args.calls, args.rounds)
        fan = await fan_out_rounds(fleet, sids, args.jobs // args.sessions, args.rounds)
    return report(lat, tp, fan, args)


def report(lat: dict[str, list[float]], tp: dict[str, Any], fan: dict[str, dict[str, Any]],
           args: argparse.Namespace) -> dict[str, float]:
    print(f"load average at the end: {load_average()}")
    print(f"throughput, {args.sessions} sessions x {args.calls} sync read_file, "
          f"mean of {args.rounds} rounds:")
    for name, fig in tp.items():
        print(f"  {name:8s} {fig['per_s']:7.0f} calls/s   client CPU {fig['client_cpu_ms']:.3f} ms/call")
    ratio = tp["sdk"]["per_s"] / tp["minimal"]["per_s"]
    print(f"  sdk / minimal = {ratio:.2f} (target >= {TARGET_RATIO})")
    p = {k: (p50(v), pct(v, 0.99)) for k, v in lat.items()}
    added = p["sdk_sync"][0] - p["minimal"][0]
    print("latency, one session, sequential read_file:")
    for name in lat:
        print(f"  {name:10s} p50 {p[name][0]:6.3f} ms   p99 {p[name][1]:6.3f} ms")
    print(f"  sync SDK adds {added:.3f} ms p50 (target <= {TARGET_SYNC_ADDED_MS})")
    print(f"fan-out, {args.jobs} async read_file jobs ({args.sessions} sessions), mean of {args.rounds} "
          "rounds; completed/s from the jobs' timestamps:")
    for name, fig in fan.items():
        print(f"  {name:16s} submit {fig['submit_per_s']:6.0f}/s   completed {fig['per_s']:6.0f}/s   "
              f"submit->done p50 {fig['p50']:.0f} ms")
    fan_ratio = {pattern: fan[f"sdk_{pattern}"]["per_s"] / fan[f"minimal_{pattern}"]["per_s"]
                 for pattern in ("one_post", "batch")}
    print(f"  SDK as_completed / minimal: one POST per job {fan_ratio['one_post']:.2f}, "
          f"one batch {fan_ratio['batch']:.2f} (target: holds the minimal client's rate)")
    per_client = {f"{name}_read_file_calls_per_s": fig["per_s"] for name, fig in tp.items()}
    cpu = {f"{name}_client_cpu_ms": fig["client_cpu_ms"] for name, fig in tp.items()}
    return {
        **per_client, "sdk_to_minimal_ratio": ratio, **cpu,
        "minimal_read_p50_ms": p["minimal"][0], "sdk_sync_read_p50_ms": p["sdk_sync"][0],
        "sdk_async_read_p50_ms": p["sdk_async"][0], "sdk_sync_added_p50_ms": added,
        "minimal_async_completed_per_s": fan["minimal_one_post"]["per_s"],
        "sdk_as_completed_per_s": fan["sdk_one_post"]["per_s"],
        "sdk_as_completed_ratio": fan_ratio["one_post"],
        "minimal_batch_completed_per_s": fan["minimal_batch"]["per_s"],
        "sdk_batch_as_completed_per_s": fan["sdk_batch"]["per_s"],
        "sdk_batch_as_completed_ratio": fan_ratio["batch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20, help="sync calls per session per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=300, help="latency samples per path")
    parser.add_argument("--jobs", type=int, default=1000, help="async jobs in the fan-out phase")
    figures = asyncio.run(run(parser.parse_args()))
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
