"""Async-jobs benchmark: the whole fleet as orchestrators use it (202 + long-poll, batch, webhooks).

Starts `atefleet --config CFG up` (as bench/e2e.py does: shipped worker defaults, 110 actor slots),
resumes 100 sessions (not timed), then over real HTTP on loopback:

1. submit: 100 client tasks, one per session, each POSTs its 50 `read_file` calls with
   `Prefer: respond-async` back to back (per session in order, one keep-alive connection each);
   jobs accepted per second = 5,000 / time from the first POST to the last 202. Then each task
   long-polls its session's last job (`GET /v1/jobs/{id}?wait=30`; a session's jobs run in order,
   so the last one done means all are), and every job's JSON is read once (untimed) to check it
   succeeded. Completions per second = 5,000 / (last `finished_at` - first `created_at`), and
   submit→done latency = `finished_at` - `created_at` of each job: both from the job JSON (server
   clock, millisecond resolution), so the client's polling does not count.
2. batch (extra): the same 5,000 calls in 5 `POST /v1/jobs:batch` of 1,000, sent together; the
   batches are accepted quickly, so the completion rate here is the fleet's drain rate.
3. webhooks: 200 `read_file` jobs with `callback_url` to a loopback receiver run here, submitted
   one every 25 ms round-robin over the sessions (so the single deliverer is far from its ~200/s);
   latency = arrival at the receiver - the job's `finished_at` (from the signed payload, whose
   signature is checked with common.webhook_signing).

The client is a minimal keep-alive HTTP/1.1 client (bench.e2e.Conn, ~0.1 ms CPU per request):
httpx's pool costs ~5 ms CPU per request at this concurrency and would be the bottleneck.

    .venv/bin/python bench/async.py [--sessions 100] [--jobs 50] [--webhooks 200]

The last line is one JSON object of figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py is named like the stdlib `queue` (which asyncio imports): keep bench/ off the
# path, and put the repo root first so `common`, `tests` and `bench.e2e` import.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from datetime import datetime  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

from bench.e2e import (  # noqa: E402
    READ_SMALL,
    WRITE_SMALL,
    Conn,
    at_start_line,
    cpu_by_role,
    load_average,
    p50,
    pct,
    resume_all,
    running_fleet,
    session_path,
    throughput,
)
from common.webhook_signing import verify  # noqa: E402
from tests.e2e.conftest import RunningFleet  # noqa: E402

ASYNC = {"Prefer": "respond-async"}
TERMINAL = ("succeeded", "failed", "cancelled")

#: Issue 7's targets, printed next to the figures.
TARGET_SUBMIT_PER_S = 3000.0
TARGET_COMPLETE_PER_S = 1500.0
TARGET_WEBHOOK_P50_MS = 100.0


def unix_s(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()


def read_call(i: int, **extra: Any) -> dict[str, Any]:
    return {**READ_SMALL, "call_id": f"c{i}", **extra}


# ---------------------------------------------------------------------------------------------
# Completion: long-poll, then every job's JSON


async def wait_done(conn: Conn, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, job = await conn.request("GET", f"/v1/jobs/{job_id}?wait=30")
        if status != 200:
            raise RuntimeError(f"GET job {job_id}: {status} {job}")
        if job["state"] in TERMINAL:
            return dict(job)
    raise TimeoutError(f"job {job_id} did not finish in 120 s")


async def fetch_jobs(fleet: RunningFleet, ids: list[str], parallel: int = 50) -> list[dict[str, Any]]:
    """Every job's JSON (untimed); raises unless all succeeded."""
    out: list[dict[str, Any]] = []

    async def worker(chunk: list[str]) -> None:
        conn = await Conn.tcp(fleet.url)
        for jid in chunk:
            status, job = await conn.request("GET", f"/v1/jobs/{jid}")
            if status != 200 or job["state"] != "succeeded":
                raise RuntimeError(f"job {jid}: {status} {job}")
            out.append(job)
        await conn.close()

    await asyncio.gather(*(worker(ids[i::parallel]) for i in range(parallel)))
    return out


def completion_figures(jobs: list[dict[str, Any]]) -> dict[str, float]:
    created = [unix_s(j["created_at"]) for j in jobs]
    finished = [unix_s(j["finished_at"]) for j in jobs]
    latency = [(f - c) * 1000 for c, f in zip(created, finished, strict=True)]
    return {"per_s": len(jobs) / (max(finished) - min(created)),
            "p50": p50(latency), "p99": pct(latency, 0.99)}


# ---------------------------------------------------------------------------------------------
# Phase 1: one POST per job, per session in order


async def submit_phase(fleet: RunningFleet, sids: list[str], jobs: int) -> dict[str, Any]:
    ids: dict[str, list[str]] = {}
    accepted_at: list[float] = []

    async def session(sid: str) -> None:
        conn = await Conn.tcp(fleet.url)
        await at_start_line(start, conn.request("GET", "/healthz"))  # connected before the clock starts
        for i in range(jobs):
            status, job = await conn.request("POST", session_path(sid), read_call(i), ASYNC)
            if status != 202:
                raise RuntimeError(f"async submit: {status} {job}")
            ids.setdefault(sid, []).append(job["id"])
        accepted_at.append(time.perf_counter())
        await wait_done(conn, ids[sid][-1])
        await conn.close()

    start = asyncio.Barrier(len(sids) + 1)
    tasks = [asyncio.create_task(session(s)) for s in sids]
    await start.wait()
    cpu0, began = cpu_by_role(fleet.process.pid), time.perf_counter()
    await asyncio.gather(*tasks)
    cpu1, n = cpu_by_role(fleet.process.pid), len(sids) * jobs
    submit_per_s = n / (max(accepted_at) - began)
    done = await fetch_jobs(fleet, [j for s in sids for j in ids[s]])
    role_ms = {r: (cpu1[r] - cpu0.get(r, 0.0)) * 1000 / n for r in cpu1}
    return {"submit_per_s": submit_per_s, **completion_figures(done), "role_cpu_ms": role_ms}


# ---------------------------------------------------------------------------------------------
# Phase 2: batches


async def batch_phase(fleet: RunningFleet, sids: list[str], jobs: int, batch: int = 1000) -> dict[str, Any]:
    calls = [{"environment": "my-env", "session": sid, **read_call(i)} for i in range(jobs) for sid in sids]
    chunks = [calls[i:i + batch] for i in range(0, len(calls), batch)]
    conns = [await Conn.tcp(fleet.url) for _ in chunks]

    async def post(conn: Conn, chunk: list[dict[str, Any]]) -> list[str]:
        status, body = await conn.request("POST", "/v1/jobs:batch", {"calls": chunk})
        if status != 202:
            raise RuntimeError(f"batch: {status} {str(body)[:300]}")
        return [j["id"] for j in body["jobs"]]

    began = time.perf_counter()
    id_lists = await asyncio.gather(*(post(c, ch) for c, ch in zip(conns, chunks, strict=True)))
    accept_s = time.perf_counter() - began
    ids = [j for chunk_ids in id_lists for j in chunk_ids]
    for conn in conns:
        await conn.close()

    async def wait_last(jid: str) -> None:
        conn = await Conn.tcp(fleet.url)
        await wait_done(conn, jid)
        await conn.close()

    # The array interleaves sessions, so the last `len(sids)` jobs are each session's last one.
    await asyncio.gather(*(wait_last(jid) for jid in ids[-len(sids):]))
    return {"submit_per_s": len(ids) / accept_s, **completion_figures(await fetch_jobs(fleet, ids))}


# ---------------------------------------------------------------------------------------------
# Phase 3: webhooks


class Receiver:
    """A loopback webhook receiver: checks each signature, records arrival time and `finished_at`."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.latency_ms: dict[str, float] = {}
        self.bad_signatures = 0
        self.connections: set[asyncio.Task[Any]] = set()

    async def close(self) -> None:
        """End the deliverer's keep-alive connections (server.close() leaves them open)."""
        for task in self.connections:
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            while head := await _read_head(reader):
                arrived = time.time()
                pairs = (ln.partition(":") for ln in head.decode().split("\r\n")[1:] if ln)
                headers = {k.strip().lower(): v.strip() for k, _, v in pairs}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                self._record(arrived, headers, body)
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            self.connections.discard(task)

    def _record(self, arrived: float, headers: dict[str, str], body: bytes) -> None:
        try:
            verify(self.secret, headers, body)
        except Exception:  # any verification failure is counted, not fatal
            self.bad_signatures += 1
        job = json.loads(body)["data"]
        self.latency_ms[job["id"]] = (arrived - unix_s(job["finished_at"])) * 1000


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


async def webhook_phase(fleet: RunningFleet, sids: list[str], count: int,
                        gap_s: float = 0.025) -> dict[str, Any]:
    secrets = yaml.safe_load(fleet.config_path.read_text())["webhooks"]["secrets"]
    secret_id, secret = next(iter(secrets.items()))
    receiver = Receiver(secret)
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    conn = await Conn.tcp(fleet.url)
    ids = []
    try:
        for i in range(count):
            body = read_call(i, callback_url=url, callback_secret_id=secret_id)
            status, job = await conn.request("POST", session_path(sids[i % len(sids)]), body, ASYNC)
            if status != 202:
                raise RuntimeError(f"async submit with callback: {status} {job}")
            ids.append(job["id"])
            await asyncio.sleep(gap_s)
        deadline = time.monotonic() + 60
        while not all(j in receiver.latency_ms for j in ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sum(j not in receiver.latency_ms for j in ids)} callbacks missing")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
        server.close()
        await receiver.close()
    latency = [receiver.latency_ms[j] for j in ids]
    return {"p50": p50(latency), "p99": pct(latency, 0.99), "bad_signatures": receiver.bad_signatures}


# ---------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def report(one: dict[str, Any], batch: dict[str, Any], hooks: dict[str, Any], n: int,
           resume_s: float) -> dict[str, float]:
    roles = ", ".join(f"{r} {ms:.2f}" for r, ms in sorted(one["role_cpu_ms"].items(), key=lambda kv: -kv[1])
                      if ms >= 0.01)
    print(f"load average at the end: {load_average()} (resumed the sessions in {resume_s:.1f} s)")
    print(f"{n} async read_file jobs, one POST each (100 sessions, per session in order):")
    print(f"  submit      {one['submit_per_s']:7.0f} jobs/s accepted (target >= {TARGET_SUBMIT_PER_S:.0f}: "
          f"{verdict(one['submit_per_s'] >= TARGET_SUBMIT_PER_S)})")
    print(f"  complete    {one['per_s']:7.0f} jobs/s (target >= {TARGET_COMPLETE_PER_S:.0f}: "
          f"{verdict(one['per_s'] >= TARGET_COMPLETE_PER_S)})")
    print(f"  submit→done p50 {one['p50']:.0f} ms, p99 {one['p99']:.0f} ms (created_at → finished_at)")
    print(f"  fleet CPU {sum(one['role_cpu_ms'].values()):.2f} ms per job ({roles})")
    print(f"same {n} jobs in batches of 1,000 (5 concurrent POST /v1/jobs:batch):")
    print(f"  submit      {batch['submit_per_s']:7.0f} jobs/s accepted; "
          f"complete {batch['per_s']:.0f} jobs/s; "
          f"submit→done p50 {batch['p50']:.0f} ms, p99 {batch['p99']:.0f} ms")
    print(f"webhooks: {hooks['count']} jobs with callback_url, one every 25 ms: delivered after done "
          f"p50 {hooks['p50']:.1f} ms, p99 {hooks['p99']:.1f} ms "
          f"(target p50 <= {TARGET_WEBHOOK_P50_MS:.0f} ms: "
          f"{verdict(hooks['p50'] <= TARGET_WEBHOOK_P50_MS)}); bad signatures: {hooks['bad_signatures']}")
    return {
        "submit_per_s": one["submit_per_s"], "complete_per_s": one["per_s"],
        "submit_to_done_p50_ms": one["p50"], "submit_to_done_p99_ms": one["p99"],
        "fleet_cpu_ms_per_job": sum(one["role_cpu_ms"].values()),
        "batch_submit_per_s": batch["submit_per_s"], "batch_complete_per_s": batch["per_s"],
        "batch_submit_to_done_p50_ms": batch["p50"], "batch_submit_to_done_p99_ms": batch["p99"],
        "webhook_after_done_p50_ms": hooks["p50"], "webhook_after_done_p99_ms": hooks["p99"],
        "webhook_bad_signatures": hooks["bad_signatures"],
    }


async def run(args: argparse.Namespace) -> dict[str, float]:
    print(f"load average at start: {load_average()}")
    with running_fleet("bench-async-") as fleet:
        sids = [f"as-{i}-{uuid.uuid4().hex[:8]}" for i in range(args.sessions)]
        resume_s = await resume_all(fleet, sids)
        await throughput(fleet, sids, 1, WRITE_SMALL)  # the file to read; warms every session
        one = await submit_phase(fleet, sids, args.jobs)
        print(f"  (phase 1 done: submit {one['submit_per_s']:.0f}/s, complete {one['per_s']:.0f}/s)")
        batch = await batch_phase(fleet, sids, args.jobs)
        hooks = {**await webhook_phase(fleet, sids, args.webhooks), "count": args.webhooks}
    return report(one, batch, hooks, args.sessions * args.jobs, resume_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=50, help="async jobs per session")
    parser.add_argument("--webhooks", type=int, default=200, help="jobs with a callback_url")
    figures = asyncio.run(run(parser.parse_args()))
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
