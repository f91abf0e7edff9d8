"""Guest benchmark: per-call latency of bash true / read_file 1 KiB / write_file 1 KiB against a
real guest over its unix socket, next to the raw operation measured in the same run; the guest's
CPU per call; plus the guest's RSS and its time from spawn to ready. The guest runs on the local
Substrate's command line, without its sandbox.

Calls go through a minimal keep-alive HTTP/1.1 client on the socket, so the figures are the
guest's cost (HTTP parse, routing, journal, tool) rather than the client library's. The worker's
view goes through GuestClient (common/guest_http.py): its latency and its own CPU per call
(process_time of this process around the calls, so it includes the event loop), on the stdlib
loop and on uvloop (the network-only roles' loop, common/event_loop.py).

Run: .venv/bin/python bench/guest.py [--n 400]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Run as a script, bench/ is sys.path[0]: its sibling modules (e.g. bench/queue.py) would shadow
# the stdlib. The repo root takes its place.
sys.path[0] = str(REPO)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import uvloop  # noqa: E402

from common.guest_client import GuestClient  # noqa: E402
from common.guest_protocol import ACTOR_HEADER, GuestAddress  # noqa: E402
from local_substrate.guests import GUEST_BOOT, PYTHON_FLAGS  # noqa: E402
from local_substrate.sandbox import python_executable  # noqa: E402

ACTOR = "s-bench-0123456789abcde"
#: Untimed calls before each timed block (imports, caches, first journal writes).
WARMUP = 30


class RawClient:
    """Keep-alive HTTP/1.1 over a unix socket, JSON in and out; nothing else."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def request(self, method: str, target: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {target} HTTP/1.1\r\nhost: guest\r\n{ACTOR_HEADER}: {ACTOR}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + data)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        header, self.buf = self.buf.split(b"\r\n\r\n", 1)
        length = int(
            next(
                line.split(b":")[1]
                for line in header.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(self.buf) < length:
            self.buf += self.sock.recv(65536)
        payload, self.buf = self.buf[:length], self.buf[length:]
        return json.loads(payload)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def cpu_s(pid: int) -> float:
    """The process's own CPU so far (utime + stime; children it waited for are not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warm_up(fn: Callable[[int], Any]) -> None:
    for i in range(WARMUP):
        fn(-1 - i)


def timed(fn: Callable[[int], Any], n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def start_guest(tmp: Path, tag: str) -> tuple[subprocess.Popen[bytes], float]:
    sock = str(tmp / f"{tag}.sock")
    # The local Substrate's command line (isolated interpreter, no site, ssl kept out), without
    # the sandbox: what every cold resume starts, so its RSS is what each running or frozen
    # sandbox's guest holds.
    boot = GUEST_BOOT.format(path=[str(REPO), sysconfig.get_path("purelib")])
    cmd = [
        python_executable(),
        *PYTHON_FLAGS,
        "-c",
        boot,
        "--uds",
        sock,
        "--workspace",
        str(tmp / "ws"),
        "--state-dir",
        str(tmp / f"state-{tag}"),
        "--skills-dir",
        str(tmp / "skills"),
    ]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL)
    while True:
        try:
            RawClient(sock).request("GET", "/readyz")
            return proc, (time.perf_counter() - began) * 1000
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.002)


def rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def uss_mb(pid: int) -> float:
    """Memory only this process holds (private pages): what one more guest costs the host, where
    RSS also counts the interpreter's and libraries' pages that every guest shares."""
    fields = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    n = parser.parse_args().n
    tmp = Path(tempfile.mkdtemp(prefix="guest-bench-"))
    try:
        bench(n, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench(n: int, tmp: Path) -> None:
    (tmp / "ws").mkdir()
    ready = []
    for i in range(5):
        p, ms = start_guest(tmp, f"r{i}")
        ready.append(ms)
        p.terminate()
        p.wait()
    proc, _ = start_guest(tmp, "main")
    client = RawClient(str(tmp / "main.sock"))
    ws = tmp / "ws"
    (ws / "one_k.txt").write_bytes(b"x" * 1024)
    payload = "y" * 1024
    seq = iter(range(10**9))

    def guest_call(tool: str, args: dict[str, Any]) -> Callable[[int], Any]:
        def fn(_: int) -> Any:
            view = client.request(
                "POST",
                "/v1/executions",
                {"job_id": f"b{next(seq)}", "tool": tool, "arguments": args, "wait_s": 5},
            )
            assert view["state"] == "finished" and not view["result"].get("is_error"), view

        return fn

    def raw_spawn(_: int) -> None:
        subprocess.run(
            ["/bin/sh", "-c", "true"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            check=True,
        )

    def raw_read(_: int) -> None:
        with open(ws / "one_k.txt", "rb") as f:
            f.read()

    def raw_write(i: int) -> None:
        tmpf = ws / f".raw.{i}.tmp"
        with open(tmpf, "wb") as f:
            f.write(payload.encode())
        os.replace(tmpf, ws / "raw_out.txt")

    results: dict[str, tuple[float, float]] = {}
    #: Guest CPU (ms) per call of each guest operation, over its timed block.
    guest_cpu: dict[str, float] = {}
    # Interleave raw and guest runs so machine noise hits both alike.
    for name, fn in [
        ("raw_spawn", raw_spawn),
        ("bash_true", guest_call("bash", {"command": "true"})),
        ("raw_read_1k", raw_read),
        ("read_1k", guest_call("read_file", {"path": "one_k.txt"})),
        ("raw_write_1k", raw_write),
        ("write_1k", guest_call("write_file", {"path": "w.txt", "content": payload})),
        ("readyz", lambda _: client.request("GET", "/readyz")),
    ]:
        warm_up(fn)
        cpu_before = cpu_s(proc.pid)
        results[name] = percentiles(timed(fn, n))
        guest_cpu[name] = (cpu_s(proc.pid) - cpu_before) * 1000 / n
        cpu = f"   guest CPU {guest_cpu[name]:.3f} ms/call" if not name.startswith("raw_") else ""
        print(f"{name:14s} p50 {results[name][0]:7.3f} ms   p99 {results[name][1]:7.3f} ms{cpu}")

    async def via_guest_client(tool: str, args: dict[str, Any], count: int) -> tuple[list[float], float]:
        """Latencies of `count` calls through GuestClient, and this process's CPU (ms) per call."""
        out = []
        async with GuestClient(GuestAddress(uds=str(tmp / "main.sock")), actor=ACTOR) as gc:
            for i in range(WARMUP):
                await gc.run(f"gcw-{tool}{i}", tool, args)
            cpu_before = time.process_time()
            for i in range(count):
                t = time.perf_counter()
                await gc.run(f"gc-{tool}{i}", tool, args)
                out.append(time.perf_counter() - t)
            return out, (time.process_time() - cpu_before) * 1000 / count

    gc_samples, _ = asyncio.run(via_guest_client("bash", {"command": "true"}, n // 2))
    gc_p50, gc_p99 = percentiles(gc_samples)
    print(f"{'bash_true via GuestClient':28s} p50 {gc_p50:7.3f} ms   p99 {gc_p99:7.3f} ms")
    read_1k = ("read_file", {"path": "one_k.txt"}, n)
    gc_read_samples, client_cpu_read = asyncio.run(via_guest_client(*read_1k))
    gc_read_p50, gc_read_p99 = percentiles(gc_read_samples)
    print(
        f"{'read_1k via GuestClient':28s} p50 {gc_read_p50:7.3f} ms   p99 {gc_read_p99:7.3f} ms"
        f"   client CPU {client_cpu_read:.3f} ms/call"
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        uv_samples, client_cpu_read_uv = runner.run(via_guest_client(*read_1k))
    uv_p50, uv_p99 = percentiles(uv_samples)
    print(
        f"{'read_1k GuestClient, uvloop':28s} p50 {uv_p50:7.3f} ms   p99 {uv_p99:7.3f} ms"
        f"   client CPU {client_cpu_read_uv:.3f} ms/call"
    )
    rss, hwm = rss_mb(proc.pid)
    uss = uss_mb(proc.pid)
    proc.terminate()
    proc.wait()
    ready_ms = statistics.median(ready)
    print(
        f"guest overhead p50: bash {results['bash_true'][0] - results['raw_spawn'][0]:.3f} ms, "
        f"read {results['read_1k'][0] - results['raw_read_1k'][0]:.3f} ms, "
        f"write {results['write_1k'][0] - results['raw_write_1k'][0]:.3f} ms"
    )
    print(f"guest RSS {rss:.1f} MB (peak {hwm:.1f} MB, its own {uss:.1f} MB); "
          f"ready in {ready_ms:.0f} ms (median of 5 starts)")
    figures = {
        "bash_true_p50_ms": results["bash_true"][0],
        "bash_true_p99_ms": results["bash_true"][1],
        "raw_spawn_p50_ms": results["raw_spawn"][0],
        "raw_spawn_p99_ms": results["raw_spawn"][1],
        "read_1k_p50_ms": results["read_1k"][0],
        "read_1k_p99_ms": results["read_1k"][1],
        "raw_read_1k_p50_ms": results["raw_read_1k"][0],
        "write_1k_p50_ms": results["write_1k"][0],
        "write_1k_p99_ms": results["write_1k"][1],
        "raw_write_1k_p50_ms": results["raw_write_1k"][0],
        "readyz_p50_ms": results["readyz"][0],
        "bash_true_guest_client_p50_ms": gc_p50,
        "read_1k_guest_client_p50_ms": gc_read_p50,
        "guest_cpu_bash_ms": guest_cpu["bash_true"],
        "guest_cpu_read_ms": guest_cpu["read_1k"],
        "guest_cpu_write_ms": guest_cpu["write_1k"],
        "client_cpu_read_ms": client_cpu_read,
        "client_cpu_read_uvloop_ms": client_cpu_read_uv,
        "guest_rss_mb": rss,
        "guest_peak_rss_mb": hwm,
        "guest_uss_mb": round(uss, 2),
        "guest_ready_ms": ready_ms,
    }
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
