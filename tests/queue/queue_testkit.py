"""Helpers shared by the queue tests: waiting on conditions, worker processes, log checks."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

from common.queue import JobKind, NewJob, Queue

WORKER_PROGRAM = Path(__file__).with_name("queue_worker_proc.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


async def wait_for(
    cond: Callable[[], Awaitable[bool]], timeout_s: float, what: str, every_s: float = 0.02
) -> None:
    """Poll `cond` until true; fail with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)


def job(session: str, i: int, env: str = "env") -> NewJob:
    return NewJob(env, session, JobKind.TOOL, {"i": i}, "tester")


@dataclass
class WorkerProc:
    """One queue_worker_proc.py child process."""

    proc: subprocess.Popen[bytes]
    worker_id: str

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class WorkerFleet:
    """Worker processes of a test; every started one is stopped at the end."""

    redis_url: str
    prefix: str = "af:"
    concurrency: int = 16
    lease_ttl_s: float = 1.0
    min_job_ms: float = 0.0
    max_job_ms: float = 2.0
    jobs_per_turn: int = 8
    #: Worker ids are `<name><n>-<test pid>`: distinct names keep two fleets of a test apart.
    name: str = "w"
    #: More Redis servers (cells, docs/scaling.md) each worker serves besides `redis_url`.
    other_cells: list[str] = field(default_factory=list)
    procs: list[WorkerProc] = field(default_factory=list)
    started: int = 0

    def start(self) -> WorkerProc:
        self.started += 1
        worker_id = f"{self.name}{self.started}-{os.getpid()}"
        args = [sys.executable, str(WORKER_PROGRAM), "--redis-url", self.redis_url, "--prefix", self.prefix,
                "--worker-id", worker_id, "--concurrency", str(self.concurrency),
                "--lease-ttl-s", str(self.lease_ttl_s), "--max-job-ms", str(self.max_job_ms),
                "--min-job-ms", str(self.min_job_ms),
                "--jobs-per-turn", str(self.jobs_per_turn)]
        for url in self.other_cells:
            args += ["--redis-url", url]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL)
        wp = WorkerProc(proc, worker_id)
        self.procs.append(wp)
        return wp

    async def wait_working(
        self, redis: aioredis.Redis, workers: list[WorkerProc], timeout_s: float = 30
    ) -> None:
        """Until each worker has published its counters (it is connected and consuming)."""
        async def up() -> bool:
            return all([await redis.exists(f"t:stats:{w.worker_id}") for w in workers])

        await wait_for(up, timeout_s, "worker processes to start")

    def stop_all(self) -> None:
        for wp in self.procs:
            wp.stop()


async def enqueue_sessions(queue: Queue, sessions: int, jobs_per_session: int) -> dict[str, list[str]]:
    """Enqueue jobs round-robin over sessions (batches of one job per session); order per session."""
    order: dict[str, list[str]] = {f"s{n}": [] for n in range(sessions)}
    for i in range(jobs_per_session):
        batch = [job(s, i) for s in order]
        for s, res in zip(order, await queue.enqueue_batch(batch), strict=True):
            order[s].append(res.job_id)
    return order


@dataclass
class LogEntry:
    kind: str  # S = start, E = end, X = interrupted (the handler was cancelled: its lease lost)
    job_id: str
    epoch: int
    worker: str
    ts: float


async def session_logs(redis: aioredis.Redis, sessions: list[str]) -> dict[str, list[LogEntry]]:
    """The handler logs (`t:log:<session>`) written by queue_worker_proc.py."""
    pipe = redis.pipeline(transaction=False)
    for s in sessions:
        pipe.lrange(f"t:log:env/{s}", 0, -1)
    out: dict[str, list[LogEntry]] = {}
    for s, raw in zip(sessions, await pipe.execute(), strict=True):
        entries = []
        for item in raw:
            kind, jid, epoch, worker, ts = item.decode().split("|")
            entries.append(LogEntry(kind, jid, int(epoch), worker, float(ts)))
        out[s] = entries
    return out


def check_session_log(entries: list[LogEntry], order: list[str], killed: set[str]) -> list[str]:
    """Problems with one session's executions (empty = FIFO kept, no overlap, nothing skipped).

    An execution that never ended is allowed only if it was interrupted (its worker was killed,
    or its handler was cancelled because its lease was lost, however late that execution could
    log it), and the next start must then be the same job under a higher epoch (resumed at the
    head).
    """
    cancelled = {(e.job_id, e.epoch) for e in entries if e.kind == "X"}
    problems: list[str] = []
    pos = -1  # index in `order` of the job being worked on
    open_exec: LogEntry | None = None
    last_end: str | None = None
    for e in entries:
        if e.kind == "X":
            continue
        if e.kind == "S":
            if open_exec is not None:
                if open_exec.worker not in killed and (open_exec.job_id, open_exec.epoch) not in cancelled:
                    problems.append(f"overlap: {e.job_id}@{e.epoch} started while {open_exec.job_id} runs")
                if e.job_id != open_exec.job_id or e.epoch <= open_exec.epoch:
                    problems.append(f"not resumed at head: {open_exec.job_id} then {e.job_id}")
            elif pos >= 0 and e.job_id == order[pos]:
                pass  # re-execution: ended but its completion was not recorded before a kill
            elif pos + 1 < len(order) and e.job_id == order[pos + 1] and (pos < 0 or last_end == order[pos]):
                pos += 1
            else:
                problems.append(f"FIFO violation: started {e.job_id} at position {pos}")
            open_exec = e
        else:
            if open_exec is None or (open_exec.job_id, open_exec.epoch) != (e.job_id, e.epoch):
                problems.append(f"end of {e.job_id}@{e.epoch} does not match the running execution")
            open_exec, last_end = None, e.job_id
    if pos != len(order) - 1 or last_end != order[-1]:
        problems.append(f"incomplete: reached position {pos} of {len(order)}")
    return problems


async def terminal_event_counts(redis: aioredis.Redis, prefix: str = "af:") -> dict[str, int]:
    """Job id → number of terminal entries in the `events` stream."""
    counts: dict[str, int] = {}
    last = "-"
    while True:
        batch = await redis.xrange(f"{prefix}events", min=last, count=10000)
        if last != "-":
            batch = batch[1:]
        if not batch:
            return counts
        for _eid, fields in batch:
            if fields[b"state"] in (b"succeeded", b"failed", b"cancelled"):
                jid = fields[b"job"].decode()
                counts[jid] = counts.get(jid, 0) + 1
        last = batch[-1][0].decode()


async def run_repairs(queue: Queue, period_s: float, stop: asyncio.Event) -> None:
    """What the reconciler does: the repair primitives in a loop (tolerating Redis outages)."""
    while not stop.is_set():
        try:
            await queue.repair()
        except (OSError, ConnectionError) as err:
            print("repair pass failed:", err)
        except Exception as err:  # redis errors while it restarts
            print("repair pass failed:", type(err).__name__, err)
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except TimeoutError:
            pass
