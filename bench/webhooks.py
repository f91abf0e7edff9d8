"""Webhook delivery latency after job completion, through the real deliverer process.

Starts an embedded Redis, the deliverer (`atefleet webhooks`, a child process as in production) and
a loopback receiver; completes jobs through the queue's worker path and measures, per job, the
time from its `finished_at` to the callback's arrival at the receiver. Two phases: jobs finishing
one at a time (steady traffic) and a burst finishing together (throughput, queueing).

    .venv/bin/python bench/webhooks.py [--steady 300] [--burst 1000]

The last line is one JSON object: webhook_after_done_p50_ms / _p99_ms (steady), burst figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py is named like the stdlib `queue` (which redis imports): keep bench/ off the path.
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

from common.config import Config, parse_config  # noqa: E402
from common.embedded_redis import start_embedded_redis  # noqa: E402
from common.queue import JobKind, JobState, NewJob, Queue  # noqa: E402
from common.redis.client import RedisClient  # noqa: E402

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

#: The deliverer runs as in production: the `atefleet webhooks` role in its own process.
DELIVERER_CMD = [sys.executable, "-m", "atefleet"]


class Receiver:
    """Records the arrival time of each callback by webhook-id, answering 204."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until the client closes it (keep-alive, as real receivers)."""
        try:
            while head := await _read_head(reader):
                at = time.time()
                headers = _parse_headers(head)
                await reader.readexactly(int(headers.get("content-length", "0")))
                writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                self.arrivals[headers["webhook-id"]] = at
                self.changed.set()
        finally:
            writer.close()

    async def wait_for(self, job_ids: list[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(j in self.arrivals for j in job_ids):
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{sum(j not in self.arrivals for j in job_ids)} callbacks missing")
            await asyncio.wait_for(self.changed.wait(), remaining)


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def _parse_headers(head: bytes) -> dict[str, str]:
    lines = head.decode().split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}


async def complete_all(queue: Queue, job_ids: list[str]) -> None:
    """Finish every queued job (each in its own session) through take_work → complete."""
    left = set(job_ids)
    while left:
        for got in await queue.take_work("bench-worker", 1000):
            await queue.complete(got.lease, got.job.id, JobState.SUCCEEDED, result={"exit_code": 0})
            left.discard(got.job.id)


async def submit(queue: Queue, url: str, count: int, tag: str) -> list[str]:
    jobs = [NewJob("default-env", f"{tag}-{i}", JobKind.TOOL, {"tool": "bash"}, "bench",
                   callback_url=url, callback_secret_id="main") for i in range(count)]
    return [r.job_id for r in await queue.enqueue_batch(jobs)]


async def latencies_ms(queue: Queue, receiver: Receiver, job_ids: list[str]) -> list[float]:
    out = []
    for jid in job_ids:
        job = await queue.get_job(jid)
        assert job is not None and job.finished_at is not None
        out.append((receiver.arrivals[jid] - job.finished_at) * 1000)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


async def steady(queue: Queue, receiver: Receiver, url: str, count: int) -> list[float]:
    """One job completes at a time, each a random 0-100 ms after the previous callback arrived.

    The random gap keeps completions out of phase with arq's polling, as independent traffic is.
    """
    rng = random.Random(7)
    ids = []
    for i in range(count):
        (jid,) = await submit(queue, url, 1, f"steady{i}")
        await complete_all(queue, [jid])
        await receiver.wait_for([jid])
        ids.append(jid)
        await asyncio.sleep(rng.uniform(0, 0.1))
    return await latencies_ms(queue, receiver, ids)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def burst(
    queue: Queue, receiver: Receiver, url: str, count: int, deliverer_pid: int
) -> tuple[list[float], float, float]:
    """`count` jobs finish together; latencies, deliveries/s and the deliverer's CPU ms per delivery."""
    ids = await submit(queue, url, count, "burst")
    started, cpu_before = time.monotonic(), cpu_s(deliverer_pid)
    await complete_all(queue, ids)
    await receiver.wait_for(ids)
    elapsed, cpu_used = time.monotonic() - started, cpu_s(deliverer_pid) - cpu_before
    return await latencies_ms(queue, receiver, ids), count / elapsed, cpu_used * 1000 / count


def start_child(config_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([*DELIVERER_CMD, "--config", str(config_path), "webhooks"], env=env, cwd=REPO)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-webhooks-"))
    redis_server = start_embedded_redis(workdir / "redis")
    settings = {"redis_prefix": "bw:", "log_level": "WARNING", "redis": {"url": redis_server.url},
                "webhooks": {"secrets": {"main": SECRET}, "allow_private_targets": True}}
    config: Config = parse_config(settings)
    (workdir / "config.yaml").write_text(yaml.safe_dump(settings))
    receiver = Receiver()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    redis = RedisClient.from_url(redis_server.url)
    queue = Queue(redis, config)
    await queue.load_scripts()
    child = start_child(workdir / "config.yaml")
    try:
        await steady(queue, receiver, url, 5)  # warm-up: the child is up and connected
        steady_ms = await steady(queue, receiver, url, args.steady)
        burst_ms, burst_per_s, cpu_ms = await burst(queue, receiver, url, args.burst, child.pid)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(30)
        await redis.aclose()
        server.close()
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"steady ({args.steady} jobs, one at a time): after-done p50 {pct(steady_ms, 0.5)} ms, "
          f"p99 {pct(steady_ms, 0.99)} ms, mean {statistics.fmean(steady_ms):.1f} ms")
    print(f"burst ({args.burst} jobs at once): {burst_per_s:.0f} deliveries/s, "
          f"after-done p50 {pct(burst_ms, 0.5)} ms, p99 {pct(burst_ms, 0.99)} ms, "
          f"deliverer CPU {cpu_ms:.2f} ms per delivery")
    return {
        "webhook_after_done_p50_ms": pct(steady_ms, 0.5),
        "webhook_after_done_p99_ms": pct(steady_ms, 0.99),
        "webhook_burst_per_s": round(burst_per_s),
        "webhook_burst_after_done_p50_ms": pct(burst_ms, 0.5),
        "webhook_burst_after_done_p99_ms": pct(burst_ms, 0.99),
        "webhook_cpu_ms_per_delivery": round(cpu_ms, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady", type=int, default=300)
    parser.add_argument("--burst", type=int, default=1000)
    figures = asyncio.run(main(parser.parse_args()))
    print(json.dumps(figures))
