"""End-to-end benchmark of the synchronous surface: the whole fleet as users run it.

Starts `atefleet --config CFG up` (embedded Redis, local Substrate with sandboxed actors, API,
workers as shipped (`workers` defaults: one process, 64 sessions at once), reconciler, webhook
deliverer) and measures over real HTTP on loopback:

- sync `bash true` and `read_file` (a 1 KiB file) round trips on one session, sequential, after a
  warm-up, next to the same calls made directly against a standalone guest (`python -m guest` on a
  unix socket) and a raw `sh -c true` spawn, interleaved in rounds in the same run so machine
  noise hits all alike; the fleet's overhead = fleet p50 - direct guest p50;
- throughput: 100 sessions x 20 sequential sync calls each from 100 concurrent client tasks
  (bash `true`, then `read_file`), with the CPU each fleet role spent per call;
- RSS of the API process and of the worker processes (children of `up`, found through /proc).

Client: the headline figures use a minimal keep-alive HTTP/1.1 client (one connection per task,
~0.1 ms CPU per call) on both the fleet and the direct guest, so the overhead compares like with
like. httpx's AsyncClient costs ~5 ms of CPU per call with 100 connections in its pool, which on
2 shared cores made the client the bottleneck; its figures are printed next to the others
(`*_httpx`), and the direct guest through GuestClient (the worker's own httpx client) too.

    .venv/bin/python bench/e2e.py [--n 300] [--sessions 100] [--calls 20]

The last line is one JSON object of figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py is named like the stdlib `queue` (which asyncio and httpx import): keep bench/ off
# the path, and put the repo root first so `common`, `tests` and `bench.*` import.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
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
from common.guest_protocol import ACTOR_HEADER, GuestAddress  # noqa: E402
from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet  # noqa: E402

ENV = "my-env"
SMALL_FILE = "small.txt"
SMALL_CONTENT = "x" * 1023 + "\n"
GUEST_ACTOR = "s-direct-0123456789abcde"

#: Issue 6's targets, printed next to the figures.
TARGET_BASH_P50_MS = 3.0
TARGET_OVERHEAD_P50_MS = 1.5
TARGET_READ_PER_S = 1500.0

Call = Callable[[], Awaitable[None]]


# ---------------------------------------------------------------------------------------------
# Shared with bench/async.py


def tool_call(tool: str, arguments: dict[str, Any], call_id: str = "c", **extra: Any) -> dict[str, Any]:
    """A seed-shaped tool call body."""
    return {"call_id": call_id, "type": "function_call",
            "function": {"name": tool, "arguments": json.dumps(arguments)}, **extra}


BASH_TRUE = tool_call("bash", {"command": "true"})
READ_SMALL = tool_call("read_file", {"path": SMALL_FILE})
WRITE_SMALL = tool_call("write_file", {"path": SMALL_FILE, "content": SMALL_CONTENT})


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


class Conn:
    """Keep-alive HTTP/1.1 on one TCP or unix socket connection, JSON in and out; nothing else."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 headers: dict[str, str] | None = None) -> None:
        self.reader, self.writer = reader, writer
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    @classmethod
    async def tcp(cls, base_url: str) -> Conn:
        host, port = base_url.split("//", 1)[1].rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    @classmethod
    async def unix(cls, path: str, headers: dict[str, str]) -> Conn:
        return cls(*await asyncio.open_unix_connection(path), headers)

    async def request(self, method: str, target: str, body: Any = None,
                      headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(f"{method} {target} HTTP/1.1\r\nhost: bench\r\n{self.fixed}{extra}"
                          f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                          .encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        if fields.get(b"transfer-encoding") == b"chunked":
            payload = await self._chunked()
        else:
            payload = await self.reader.readexactly(int(fields.get(b"content-length", b"0")))
        return int(head[9:12]), json.loads(payload) if payload else None

    async def _chunked(self) -> bytes:
        out = b""
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            out += (await self.reader.readexactly(size + 2))[:-2]
        await self.reader.readuntil(b"\r\n")
        return out

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def fleet_config(tmp: Path, slots: int) -> dict[str, Any]:
    """The e2e tests' fleet config with room for `slots` actors and the shipped worker defaults.

    (The e2e tests run two worker processes, to cover sessions spread over workers. On 2 cores one
    process, the default, does better: each wake-up finds more work, ~0.9 ms of fleet CPU per
    `read_file` call against ~1.05 with two.)"""
    cfg = base_config(tmp, free_port())
    cfg["local_substrate"] = {**cfg["local_substrate"], "slots": slots}
    del cfg["workers"]
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


async def resume_all(fleet: RunningFleet, sids: list[str], parallel: int = 25) -> float:
    """Resume every session (bounded parallelism: each starts a sandboxed actor); seconds taken."""
    gate = asyncio.Semaphore(parallel)

    async def one(sid: str) -> None:
        async with gate:
            conn = await Conn.tcp(fleet.url)
            status, body = await conn.request("POST", f"{session_path(sid)}/resume")
            await conn.close()
            if status != 200:
                raise RuntimeError(f"resume {sid}: {status} {body}")

    began = time.perf_counter()
    await asyncio.gather(*(one(s) for s in sids))
    return time.perf_counter() - began


def _proc_table() -> dict[int, tuple[int, list[bytes], float]]:
    """pid → (ppid, argv, CPU seconds incl. reaped children) for every process we can read."""
    table = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        table[int(entry.name)] = (int(stat[1]), argv, sum(int(x) for x in stat[11:15]) / tick)
    return table


def _role(argv: list[bytes]) -> str:
    if b"atefleet" in argv and argv.index(b"atefleet") + 1 < len(argv):
        return argv[argv.index(b"atefleet") + 1].decode()
    # redis-server rewrites its title: argv[0] is then "path/redis-server host:port   ".
    return "redis" if argv and b"redis-server" in argv[0] else "other"


def fleet_children(up_pid: int) -> dict[int, str]:
    """The `up` process's children: pid → role (`api`, `worker`, `redis`, ...)."""
    return {pid: _role(argv) for pid, (ppid, argv, _) in _proc_table().items() if ppid == up_pid}


def cpu_by_role(up_pid: int) -> dict[str, float]:
    """CPU seconds used so far per role; the actors' guests (and their commands) count as `guests`."""
    table = _proc_table()
    out: dict[str, float] = {}
    children = {pid: _role(table[pid][1]) for pid, (ppid, _, _) in table.items() if ppid == up_pid}
    for pid, (_, _, cpu) in table.items():
        top, cur = None, pid
        while cur in table and cur not in children and cur > 1:
            top, cur = cur, table[cur][0]
        if cur not in children:
            continue
        role = "guests" if top is not None and children[cur] == "local-substrate" else children[cur]
        out[role] = out.get(role, 0.0) + cpu
    return out


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:")) / 1024


# ---------------------------------------------------------------------------------------------
# Latency: one session, sequential


async def timed_ms(fn: Call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - began) * 1000)
    return out


def fleet_call(conn: Conn, sid: str, body: dict[str, Any]) -> Call:
    path = session_path(sid)

    async def call() -> None:
        status, answer = await conn.request("POST", path, body)
        if status != 200 or answer.get("is_error"):
            raise RuntimeError(f"fleet call failed: {status} {answer}")

    return call


def fleet_call_httpx(client: httpx.AsyncClient, sid: str, body: dict[str, Any]) -> Call:
    path = session_path(sid)

    async def call() -> None:
        r = await client.post(path, json=body)
        if r.status_code != 200 or r.json().get("is_error"):
            raise RuntimeError(f"fleet call failed: {r.status_code} {r.text[:300]}")

    return call


def guest_call(conn: Conn, tool: str, arguments: dict[str, Any]) -> Call:
    async def call() -> None:
        body = {"job_id": uuid.uuid4().hex, "tool": tool, "arguments": arguments, "wait_s": 5}
        status, view = await conn.request("POST", "/v1/executions", body)
        if status >= 300 or view["state"] != "finished" or view["result"].get("is_error"):
            raise RuntimeError(f"guest call failed: {status} {view}")

    return call


def guest_client_call(guest: GuestClient, tool: str, arguments: dict[str, Any]) -> Call:
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
def standalone_guest(tmp: Path) -> Iterator[str]:
    """`python -m guest` on a unix socket (as bench/guest.py runs it); its socket path; killed on exit."""
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
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(10)


async def latency(fleet: RunningFleet, guest_sock: str, n: int) -> dict[str, list[float]]:
    """Per-call ms of each path, interleaved in 3 rounds after a warm-up of 50 calls each."""
    sid = f"lat-{uuid.uuid4()}"
    await resume_all(fleet, [sid])
    conn = await Conn.tcp(fleet.url)
    gconn = await Conn.unix(guest_sock, {ACTOR_HEADER: GUEST_ACTOR})
    async with async_client(fleet, 4) as client, \
            GuestClient(GuestAddress(uds=guest_sock), actor=GUEST_ACTOR) as guest:
        await fleet_call(conn, sid, WRITE_SMALL)()
        paths = {
            "fleet_bash": fleet_call(conn, sid, BASH_TRUE),
            "guest_bash": guest_call(gconn, "bash", {"command": "true"}),
            "raw_spawn": raw_spawn,
            "fleet_read": fleet_call(conn, sid, READ_SMALL),
            "guest_read": guest_call(gconn, "read_file", {"path": SMALL_FILE}),
            "fleet_bash_httpx": fleet_call_httpx(client, sid, BASH_TRUE),
            "guest_bash_guest_client": guest_client_call(guest, "bash", {"command": "true"}),
        }
        samples: dict[str, list[float]] = {k: [] for k in paths}
        for fn in paths.values():
            await timed_ms(fn, 50)
        for _ in range(3):
            for name, fn in paths.items():
                samples[name] += await timed_ms(fn, n // 3)
    await conn.close()
    await gconn.close()
    return samples


# ---------------------------------------------------------------------------------------------
# Throughput: many sessions, concurrent clients


async def at_start_line(start: asyncio.Barrier, warm_up: Awaitable[Any]) -> None:
    """Warm up, then wait for every other task at `start`; a failure breaks the barrier for all."""
    try:
        await warm_up
    except BaseException:
        await start.abort()
        raise
    await start.wait()


async def throughput(fleet: RunningFleet, sids: list[str], calls: int, body: dict[str, Any],
                     client: httpx.AsyncClient | None = None) -> dict[str, Any]:
    """Each session's task makes `calls` sequential sync calls (own connection, or `client`).

    Returns calls/s, per-call ms, and CPU ms per call of the client and of each fleet role.
    """
    per_call: list[float] = []

    async def session(sid: str) -> None:
        conn = None
        if client is None:
            conn = await Conn.tcp(fleet.url)
            call = fleet_call(conn, sid, body)
        else:
            call = fleet_call_httpx(client, sid, body)
        await at_start_line(start, call())  # connected and warm before the clock starts
        per_call.extend(await timed_ms(call, calls))
        if conn is not None:
            await conn.close()

    start = asyncio.Barrier(len(sids) + 1)
    tasks = [asyncio.create_task(session(s)) for s in sids]
    await start.wait()
    cpu0, roles0, began = time.process_time(), cpu_by_role(fleet.process.pid), time.perf_counter()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    roles1, n = cpu_by_role(fleet.process.pid), len(sids) * calls
    return {"per_s": n / elapsed, "ms": per_call, "client_cpu_ms": (time.process_time() - cpu0) * 1000 / n,
            "role_cpu_ms": {r: (roles1[r] - roles0.get(r, 0.0)) * 1000 / n for r in roles1}}


async def concurrent_phase(fleet: RunningFleet, sessions: int, calls: int) -> dict[str, Any]:
    sids = [f"tp-{i}-{uuid.uuid4().hex[:8]}" for i in range(sessions)]
    resume_s = await resume_all(fleet, sids)
    print(f"resumed {sessions} sessions in {resume_s:.1f} s")
    await throughput(fleet, sids, 1, WRITE_SMALL)  # the file to read; warms every session
    bash = await throughput(fleet, sids, calls, BASH_TRUE)
    read = await throughput(fleet, sids, calls, READ_SMALL)
    async with async_client(fleet) as client:
        read_httpx = await throughput(fleet, sids, calls, READ_SMALL, client)
    rss = {f"{role}-{pid}" if role in ("worker", "api") else role: rss_mb(pid)
           for pid, role in fleet_children(fleet.process.pid).items() if role != "other"}
    return {"resume_s": resume_s, "bash": bash, "read": read, "read_httpx": read_httpx, "rss": rss}


# ---------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def print_throughput(label: str, tp: dict[str, Any]) -> None:
    roles = ", ".join(f"{r} {ms:.2f}" for r, ms in sorted(tp["role_cpu_ms"].items(), key=lambda kv: -kv[1])
                      if ms >= 0.01)
    print(f"  {label:22s} {tp['per_s']:7.0f} calls/s  per call p50 {p50(tp['ms']):6.1f} ms, "
          f"p99 {pct(tp['ms'], 0.99):6.1f} ms; client CPU {tp['client_cpu_ms']:.2f} ms/call")
    print(f"  {'':22s} fleet CPU {sum(tp['role_cpu_ms'].values()):.2f} ms/call ({roles})")


def report(lat: dict[str, list[float]], tp: dict[str, Any], sessions: int, calls: int) -> dict[str, float]:
    p = {k: (p50(v), pct(v, 0.99)) for k, v in lat.items()}
    overhead = p["fleet_bash"][0] - p["guest_bash"][0]
    read_overhead = p["fleet_read"][0] - p["guest_read"][0]
    print(f"load average at the end: {load_average()}")
    print(f"latency, one session, sequential ({len(lat['fleet_bash'])} calls each, after 50 warm-up):")
    for name, label in [("fleet_bash", "fleet sync bash true"), ("guest_bash", "direct guest bash true"),
                        ("raw_spawn", "raw spawn sh -c true"), ("fleet_read", "fleet sync read_file 1K"),
                        ("guest_read", "direct guest read_file 1K"),
                        ("fleet_bash_httpx", "fleet bash true, httpx"),
                        ("guest_bash_guest_client", "guest bash, GuestClient")]:
        print(f"  {label:28s} p50 {p[name][0]:7.2f} ms   p99 {p[name][1]:7.2f} ms")
    print(f"  sync bash p50 {p['fleet_bash'][0]:.2f} ms (target <= {TARGET_BASH_P50_MS} ms: "
          f"{verdict(p['fleet_bash'][0] <= TARGET_BASH_P50_MS)})")
    print(f"  fleet overhead p50 {overhead:.2f} ms over a direct guest (target <= "
          f"{TARGET_OVERHEAD_P50_MS} ms: {verdict(overhead <= TARGET_OVERHEAD_P50_MS)}); "
          f"read_file overhead {read_overhead:.2f} ms")
    print(f"throughput, {sessions} sessions x {calls} sync calls, {sessions} concurrent client tasks "
          f"(resumed them in {tp['resume_s']:.1f} s):")
    print_throughput("bash true", tp["bash"])
    print_throughput("read_file", tp["read"])
    print_throughput("read_file, httpx client", tp["read_httpx"])
    print(f"  read_file {tp['read']['per_s']:.0f} calls/s (target >= {TARGET_READ_PER_S:.0f}/s: "
          f"{verdict(tp['read']['per_s'] >= TARGET_READ_PER_S)})")
    workers = [v for k, v in tp["rss"].items() if k.startswith("worker")]
    apis = [v for k, v in tp["rss"].items() if k.startswith("api")]
    print("RSS after the run: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(tp["rss"].items())))
    return {
        "sync_bash_p50_ms": p["fleet_bash"][0], "sync_bash_p99_ms": p["fleet_bash"][1],
        "sync_read_p50_ms": p["fleet_read"][0], "sync_read_p99_ms": p["fleet_read"][1],
        "direct_guest_bash_p50_ms": p["guest_bash"][0], "direct_guest_bash_p99_ms": p["guest_bash"][1],
        "direct_guest_read_p50_ms": p["guest_read"][0],
        "raw_spawn_p50_ms": p["raw_spawn"][0], "raw_spawn_p99_ms": p["raw_spawn"][1],
        "fleet_overhead_p50_ms": overhead, "fleet_read_overhead_p50_ms": read_overhead,
        "sync_bash_httpx_p50_ms": p["fleet_bash_httpx"][0],
        "direct_guest_client_bash_p50_ms": p["guest_bash_guest_client"][0],
        "concurrent_calls_per_s": tp["bash"]["per_s"], "read_file_calls_per_s": tp["read"]["per_s"],
        "read_file_calls_per_s_httpx": tp["read_httpx"]["per_s"],
        "concurrent_call_p50_ms": p50(tp["bash"]["ms"]),
        "concurrent_call_p99_ms": pct(tp["bash"]["ms"], 0.99),
        "fleet_cpu_ms_per_read_call": sum(tp["read"]["role_cpu_ms"].values()),
        "resume_sessions_s": tp["resume_s"],
        "api_rss_mb": max(apis, default=0.0), "worker_rss_mb": max(workers, default=0.0),
    }


async def run(args: argparse.Namespace) -> dict[str, float]:
    print(f"load average at start: {load_average()}")
    with running_fleet("bench-e2e-") as fleet, tempfile.TemporaryDirectory(prefix="bench-e2e-guest-") as gtmp:
        with standalone_guest(Path(gtmp)) as guest_sock:
            lat = await latency(fleet, guest_sock, args.n)
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
