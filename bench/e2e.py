"""End-to-end benchmark of the synchronous surface: the whole fleet as users run it.

Starts `atefleet --config CFG up` (embedded Redis, local Substrate with sandboxed actors, API,
2 worker processes, reconciler, webhook deliverer) and measures over real HTTP on loopback:

- sync `bash true` and `read_file` (a 1 KiB file) round trips on one session, sequential, after a
  warm-up, next to the same calls made directly against a standalone guest (GuestClient over its
  unix socket, the worker's own client) and a raw `sh -c true` spawn, interleaved in rounds in the
  same run so machine noise hits all alike; the fleet's overhead = fleet p50 - direct guest p50;
- throughput: 100 sessions x 20 sequential sync calls each, from 100 concurrent client tasks on
  one async httpx client (bash `true`, then `read_file`);
- RSS of the API process and of the worker processes (children of `up`, found through /proc).

The client shares the 2 cores with the fleet: its own CPU time is printed with the throughput.

    .venv/bin/python bench/e2e.py [--n 300] [--sessions 100] [--calls 20]

The last line is one JSON object of figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py is named like the stdlib `queue` (which asyncio and httpx import): keep bench/ off
# the path, and put the repo root first so `common`, `tests`, `bench.*` import.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Awaitable, Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402

from common.guest_client import GuestClient  # noqa: E402
from common.guest_protocol import GuestAddress  # noqa: E402
from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet  # noqa: E402

ENV = "my-env"
SMALL_FILE = "small.txt"
SMALL_CONTENT = "x" * 1023 + "\n"

#: Issue 6's targets, printed next to the figures.
TARGET_BASH_P50_MS = 3.0
TARGET_OVERHEAD_P50_MS = 1.5
TARGET_READ_PER_S = 1500.0


# ---------------------------------------------------------------------------------------------
# Shared with bench/async.py


def tool_call(tool: str, arguments: dict[str, Any], call_id: str = "c", **extra: Any) -> dict[str, Any]:
    """A seed-shaped tool call body."""
    return {"call_id": call_id, "type": "function_call",
            "function": {"name": tool, "arguments": json.dumps(arguments)}, **extra}


BASH_TRUE = tool_call("bash", {"command": "true"})
READ_SMALL = tool_call("read_file", {"path": SMALL_FILE})


def session_path(sid: str) -> str:
    return f"/v1/environments/{ENV}/sessions/{sid}"


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank below) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50(values: list[float]) -> float:
    return statistics.median(values)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def fleet_config(tmp: Path, slots: int) -> dict[str, Any]:
    """The e2e tests' fleet config with room for `slots` actors and 2 worker processes."""
    cfg = base_config(tmp, free_port())
    cfg["local_substrate"] = {**cfg["local_substrate"], "slots": slots}
    cfg["workers"] = {**cfg["workers"], "processes": 2}
    return cfg


@contextmanager
def running_fleet(prefix: str, slots: int = 110) -> Iterator[RunningFleet]:
    """A fleet in a temp dir; stopped (SIGINT, wait) and the dir removed, even on error."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    fleet: RunningFleet | None = None
    try:
        fleet = start_fleet(tmp, fleet_config(tmp, slots))
        yield fleet
    finally:
        if fleet is not None:
            fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def async_client(fleet: RunningFleet, connections: int = 256) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=fleet.url, timeout=120, limits=limits)


async def resume_all(client: httpx.AsyncClient, sids: list[str], parallel: int = 25) -> float:
    """Resume every session (bounded parallelism: each starts a sandboxed actor); seconds taken."""
    gate = asyncio.Semaphore(parallel)

    async def one(sid: str) -> None:
        async with gate:
            r = await client.post(f"{session_path(sid)}/resume")
            r.raise_for_status()

    began = time.perf_counter()
    await asyncio.gather(*(one(s) for s in sids))
    return time.perf_counter() - began


def children_rss_mb(parent_pid: int) -> dict[str, float]:
    """VmRSS (MB) of each `atefleet ROLE` child of `parent_pid`, keyed `api`, `worker-PID`, ..."""
    out: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != parent_pid or b"atefleet" not in argv:
            continue
        role = argv[argv.index(b"atefleet") + 1].decode()
        rss_kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        out[role if role != "worker" else f"worker-{entry.name}"] = rss_kb / 1024
    return out


# ---------------------------------------------------------------------------------------------
# Latency: one session, sequential


async def timed_ms(fn: Callable[[], Awaitable[None]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - began) * 1000)
    return out


def fleet_call(client: httpx.AsyncClient, sid: str, body: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    path = session_path(sid)

    async def call() -> None:
        r = await client.post(path, json=body)
        if r.status_code != 200 or r.json().get("is_error"):
            raise RuntimeError(f"fleet call failed: {r.status_code} {r.text[:300]}")

    return call


def guest_call(guest: GuestClient, tool: str, arguments: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result, _ = await guest.run(uuid.uuid4().hex, tool, arguments)
        if result.get("is_error"):
            raise RuntimeError(f"guest call failed: {result}")

    return call


async def raw_spawn() -> None:
    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", "true", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True)
    await proc.communicate()


@contextmanager
def standalone_guest(tmp: Path) -> Iterator[GuestAddress]:
    """`python -m guest` on a unix socket, as bench/guest.py runs it; killed on exit."""
    sock, ws = tmp / "guest.sock", tmp / "ws"
    ws.mkdir(parents=True)
    (ws / SMALL_FILE).write_text(SMALL_CONTENT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "guest", "--uds", str(sock), "--workspace", str(ws),
         "--state-dir", str(tmp / "guest-state")], cwd=REPO, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the standalone guest did not start")
            time.sleep(0.01)
        yield GuestAddress(uds=str(sock))
    finally:
        proc.terminate()
        proc.wait(10)


async def latency(fleet: RunningFleet, guest_addr: GuestAddress, n: int) -> dict[str, list[float]]:
    """Per-call ms of each path, interleaved in 3 rounds after a warm-up of each."""
    samples: dict[str, list[float]] = {k: [] for k in ("fleet_bash", "fleet_read", "guest_bash",
                                                       "guest_read", "raw_spawn")}
    sid = f"lat-{uuid.uuid4()}"
    async with async_client(fleet, 4) as client, GuestClient(guest_addr, session="bench/lat") as guest:
        await resume_all(client, [sid])
        await fleet_call(client, sid, tool_call("write_file", {"path": SMALL_FILE,
                                                               "content": SMALL_CONTENT}))()
        await guest.readyz()
        paths = {
            "fleet_bash": fleet_call(client, sid, BASH_TRUE),
            "guest_bash": guest_call(guest, "bash", {"command": "true"}),
            "raw_spawn": raw_spawn,
            "fleet_read": fleet_call(client, sid, READ_SMALL),
            "guest_read": guest_call(guest, "read_file", {"path": SMALL_FILE}),
        }
        for fn in paths.values():
            await timed_ms(fn, 50)
        for _ in range(3):
            for name, fn in paths.items():
                samples[name] += await timed_ms(fn, n // 3)
    return samples


# ---------------------------------------------------------------------------------------------
# Throughput: many sessions, concurrent clients


async def throughput(client: httpx.AsyncClient, sids: list[str], calls: int,
                     body: dict[str, Any]) -> tuple[float, list[float], float]:
    """Each session's task makes `calls` sequential sync calls; calls/s, per-call ms, client CPU s."""
    per_call: list[float] = []

    async def session(sid: str) -> None:
        call = fleet_call(client, sid, body)
        per_call.extend(await timed_ms(call, calls))

    cpu0, began = time.process_time(), time.perf_counter()
    await asyncio.gather(*(session(s) for s in sids))
    elapsed = time.perf_counter() - began
    return len(sids) * calls / elapsed, per_call, time.process_time() - cpu0


async def concurrent_phase(fleet: RunningFleet, sessions: int, calls: int) -> dict[str, Any]:
    sids = [f"tp-{i}-{uuid.uuid4().hex[:8]}" for i in range(sessions)]
    async with async_client(fleet) as client:
        resume_s = await resume_all(client, sids)
        print(f"resumed {sessions} sessions in {resume_s:.1f} s")
        write = tool_call("write_file", {"path": SMALL_FILE, "content": SMALL_CONTENT})
        await asyncio.gather(*(fleet_call(client, s, write)() for s in sids))  # also warms each session
        bash_per_s, bash_ms, bash_cpu = await throughput(client, sids, calls, BASH_TRUE)
        read_per_s, read_ms, read_cpu = await throughput(client, sids, calls, READ_SMALL)
    rss = children_rss_mb(fleet.process.pid)
    return {"resume_s": resume_s, "bash_per_s": bash_per_s, "bash_ms": bash_ms, "bash_cpu_s": bash_cpu,
            "read_per_s": read_per_s, "read_ms": read_ms, "read_cpu_s": read_cpu, "rss": rss}


# ---------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def report(lat: dict[str, list[float]], tp: dict[str, Any], sessions: int, calls: int) -> dict[str, float]:
    p = {k: (p50(v), pct(v, 0.99)) for k, v in lat.items()}
    overhead = p["fleet_bash"][0] - p["guest_bash"][0]
    read_overhead = p["fleet_read"][0] - p["guest_read"][0]
    print(f"load average at the end: {load_average()}")
    print(f"latency, one session, sequential ({len(lat['fleet_bash'])} calls each, after 50 warm-up):")
    for name, label in [("fleet_bash", "fleet sync bash true"), ("guest_bash", "direct guest bash true"),
                        ("raw_spawn", "raw spawn sh -c true"), ("fleet_read", "fleet sync read_file 1K"),
                        ("guest_read", "direct guest read_file")]:
        print(f"  {label:26s} p50 {p[name][0]:7.2f} ms   p99 {p[name][1]:7.2f} ms")
    print(f"  sync bash p50 {p['fleet_bash'][0]:.2f} ms (target <= {TARGET_BASH_P50_MS} ms: "
          f"{verdict(p['fleet_bash'][0] <= TARGET_BASH_P50_MS)})")
    print(f"  fleet overhead p50 {overhead:.2f} ms over a direct guest (target <= {TARGET_OVERHEAD_P50_MS} ms: "
          f"{verdict(overhead <= TARGET_OVERHEAD_P50_MS)}); read_file overhead {read_overhead:.2f} ms")
    n = sessions * calls
    print(f"throughput, {sessions} sessions x {calls} sync calls, {sessions} concurrent client tasks:")
    print(f"  bash true  {tp['bash_per_s']:7.0f} calls/s  (per call p50 {p50(tp['bash_ms']):.1f} ms, "
          f"p99 {pct(tp['bash_ms'], 0.99):.1f} ms; client CPU {tp['bash_cpu_s'] * 1000 / n:.2f} ms/call)")
    print(f"  read_file  {tp['read_per_s']:7.0f} calls/s  (per call p50 {p50(tp['read_ms']):.1f} ms, "
          f"p99 {pct(tp['read_ms'], 0.99):.1f} ms; client CPU {tp['read_cpu_s'] * 1000 / n:.2f} ms/call)"
          f"  (target >= {TARGET_READ_PER_S:.0f}/s: {verdict(tp['read_per_s'] >= TARGET_READ_PER_S)})")
    workers = {k: v for k, v in tp["rss"].items() if k.startswith("worker-")}
    print(f"  resumed {sessions} sessions in {tp['resume_s']:.1f} s")
    print("RSS after the run: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(tp["rss"].items())))
    return {
        "sync_bash_p50_ms": p["fleet_bash"][0], "sync_bash_p99_ms": p["fleet_bash"][1],
        "sync_read_p50_ms": p["fleet_read"][0], "sync_read_p99_ms": p["fleet_read"][1],
        "direct_guest_bash_p50_ms": p["guest_bash"][0], "direct_guest_bash_p99_ms": p["guest_bash"][1],
        "direct_guest_read_p50_ms": p["guest_read"][0],
        "raw_spawn_p50_ms": p["raw_spawn"][0], "raw_spawn_p99_ms": p["raw_spawn"][1],
        "fleet_overhead_p50_ms": overhead, "fleet_read_overhead_p50_ms": read_overhead,
        "concurrent_calls_per_s": tp["bash_per_s"], "read_file_calls_per_s": tp["read_per_s"],
        "concurrent_call_p50_ms": p50(tp["bash_ms"]), "concurrent_call_p99_ms": pct(tp["bash_ms"], 0.99),
        "client_cpu_ms_per_call": tp["read_cpu_s"] * 1000 / n,
        "resume_100_s": tp["resume_s"],
        "api_rss_mb": tp["rss"].get("api", 0.0), "worker_rss_mb": max(workers.values(), default=0.0),
    }


async def run(args: argparse.Namespace) -> dict[str, float]:
    print(f"load average at start: {load_average()}")
    with running_fleet("bench-e2e-") as fleet, tempfile.TemporaryDirectory(prefix="bench-e2e-guest-") as gtmp:
        with standalone_guest(Path(gtmp)) as guest_addr:
            lat = await latency(fleet, guest_addr, args.n)
        tp = await concurrent_phase(fleet, args.sessions, args.calls)
    return report(lat, tp, args.sessions, args.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="latency samples per path")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20, help="sync calls per session")
    figures = asyncio.run(run(parser.parse_args()))
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
