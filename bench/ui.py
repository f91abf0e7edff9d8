"""Operator UI benchmark: page answer times on a big fleet's Redis, and what one viewer costs.

1. pages (default): a real Redis seeded through the queue's own enqueue script with 10,000
   sessions and 100,000 jobs (9 of 10 then marked succeeded, with their `events`, as workers
   would leave them), 1,000 dead letters, and the reconciler's stats pass run until it has folded
   every event. The API app (auth off) is served by uvicorn on loopback and each UI page is fetched
   `--rounds` times over HTTP: p50 and max per page (target ≤ 200 ms each).
2. `--viewer`: the fleet as bench/async.py starts it; its submit phase (100 sessions × 50 async
   `read_file` calls) runs `--pairs` times without and with one viewer (the overview's live
   stream plus a running job's page stream), interleaved; the throughput ratio is the cost
   (target ≤ 2%). First, with the fleet idle, the API's CPU per second is sampled for `--idle-s`
   without and with the overview open: the viewer's own CPU cost, which machine load does not
   blur (`--pairs 0` measures only this).

    .venv/bin/python bench/ui.py [--sessions 10000] [--jobs 100000] [--rounds 20]
    .venv/bin/python bench/ui.py --viewer [--pairs 3] [--viewer-sessions 100] [--jobs 50]

The last line is one JSON object of figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
import uvicorn  # noqa: E402

from api.app import create_app  # noqa: E402
from common.config import Config  # noqa: E402
from common.embedded_redis import start_embedded_redis  # noqa: E402
from common.fleet_stats import StatsPass  # noqa: E402
from common.queue import JobKind, NewJob, Queue  # noqa: E402
from common.redis.client import RedisClient  # noqa: E402

ENV = "bench-env"
TARGET_PAGE_MS = 200.0
TARGET_VIEWER_COST = 0.02
#: Jobs per enqueue script call while seeding.
SEED_BATCH = 1000
STATES = ["running", "suspended", "suspended", "suspended", "new", "lost"]


class _Report:
    examined = 0


def _config(tmp: Path, redis_url: str) -> Config:
    return Config.model_validate({"state_dir": str(tmp), "redis": {"url": redis_url},
                                  "environments": [{"name": ENV, "template": "t"}]})


async def seed(config: Config, redis_url: str, sessions: int, jobs: int) -> dict[str, Any]:
    """The fleet's Redis as it looks after `jobs` calls over `sessions` sessions."""
    redis = aioredis.Redis.from_url(redis_url)
    client = RedisClient.from_url(redis_url)
    queue = Queue(client, config)
    sids = [f"s-{i:05d}" for i in range(sessions)]
    job_ids: list[str] = []
    began = time.perf_counter()
    for start in range(0, jobs, SEED_BATCH):
        batch = [NewJob(environment=ENV, session_id=sids[(start + i) % sessions], kind=JobKind.TOOL,
                        payload={"name": "bash", "arguments": {"command": "true"}, "env_names": []},
                        principal="key:bench") for i in range(min(SEED_BATCH, jobs - start))]
        job_ids += [r.job_id for r in await queue.enqueue_batch(batch)]
    await _finish_most(redis, queue, sids, job_ids)
    pipe = redis.pipeline(transaction=False)
    for sid in sids:
        pipe.hset(queue.keys.session(f"{ENV}/{sid}"), "state", random.choice(STATES))
    for jid in job_ids[:1000]:
        pipe.xadd(queue.keys.dlq, {"job": jid, "session": f"{ENV}/s-00000", "reason": "bench",
                                   "attempts": 8})
    await pipe.execute()
    stats, folded = StatsPass(config, client, queue.keys), 0
    while True:
        report = _Report()
        await stats.run(report)
        folded += report.examined
        if not report.examined:
            break
    seeded_s = time.perf_counter() - began
    await client.aclose()
    await redis.aclose()
    print(f"seeded {sessions} sessions, {jobs} jobs, {folded} events folded in {seeded_s:.1f} s")
    return {"job": job_ids[-1], "running_job": job_ids[0], "session": sids[42]}


async def _finish_most(redis: aioredis.Redis, queue: Queue, sids: list[str], job_ids: list[str]) -> None:
    """9 jobs in 10 end (succeeded, as `complete.lua` leaves them); the rest stay queued."""
    now = int(time.time() * 1000)
    pipe = redis.pipeline(transaction=False)
    for i, jid in enumerate(job_ids):
        if i % 10 == 9:
            continue
        pipe.hset(queue.keys.job(jid), mapping={"st": "succeeded", "sa": now, "fa": now + 3,
                                                "res": '{"output":"ok"}'})
        pipe.xadd(queue.keys.events, {"job": jid, "session": f"{ENV}/{sids[i % len(sids)]}",
                                      "state": "succeeded"})
        if len(pipe) >= 10_000:
            await pipe.execute()
    await pipe.execute()


def _serve(config: Config, redis_url: str) -> tuple[str, uvicorn.Server, threading.Thread]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config, redis_url), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return url, server, thread
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("the API did not start")


def time_pages(url: str, seeded: dict[str, Any], rounds: int) -> dict[str, float]:
    pages = {
        "overview": "/ui", "sessions": f"/ui/sessions?env={ENV}",
        "sessions_rare_state": f"/ui/sessions?env={ENV}&state=destroying",
        "session": f"/ui/sessions/{ENV}/{seeded['session']}",
        "jobs": "/ui/jobs", "jobs_queued": "/ui/jobs?state=queued", "jobs_failed": "/ui/jobs?state=failed",
        "jobs_of_session": f"/ui/jobs?session={ENV}/{seeded['session']}",
        "job": f"/ui/jobs/{seeded['job']}", "dlq": "/ui/dlq", "api_dlq": "/v1/dlq",
    }
    figures: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name, path in pages.items():
            took = []
            for _ in range(rounds):
                began = time.perf_counter()
                answer = client.get(path)
                took.append((time.perf_counter() - began) * 1000)
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: {answer.status_code} {answer.text[:300]}")
            p50, worst = statistics.median(took), max(took)
            verdict = "ok" if worst <= TARGET_PAGE_MS else "OVER"
            print(f"  {name:20s} p50 {p50:6.1f} ms  max {worst:6.1f} ms  ({verdict}, "
                  f"{len(answer.content)} bytes)")
            figures[f"{name}_p50_ms"], figures[f"{name}_max_ms"] = p50, worst
    return figures


def pages_bench(args: argparse.Namespace) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    server_redis = start_embedded_redis(tmp / "redis")
    try:
        config = _config(tmp, server_redis.url)
        seeded = asyncio.run(seed(config, server_redis.url, args.sessions, args.jobs))
        url, server, thread = _serve(config, server_redis.url)
        print(f"UI pages with {args.sessions} sessions and {args.jobs} jobs in Redis "
              f"({args.rounds} rounds each):")
        try:
            figures = time_pages(url, seeded, args.rounds)
        finally:
            server.should_exit = True
            thread.join(10)
    finally:
        server_redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    worst = max(v for k, v in figures.items() if k.endswith("_max_ms"))
    print(f"slowest page: {worst:.1f} ms (target <= {TARGET_PAGE_MS:.0f} ms: "
          f"{'ok' if worst <= TARGET_PAGE_MS else 'OVER'})")
    return {**figures, "slowest_page_ms": worst}


# ---------------------------------------------------------------------------------------------
# --viewer: what one open UI costs the fleet


async def _view(url: str, stop: asyncio.Event, job_path: str | None) -> int:
    """Hold the overview's live stream (and a job page's, when given) open until `stop`; events seen."""
    seen = 0
    async with httpx.AsyncClient(base_url=url, timeout=None) as client:

        async def follow(path: str) -> None:
            nonlocal seen
            async with client.stream("GET", path) as answer:
                async for line in answer.aiter_lines():
                    seen += line.startswith("event:")

        paths = ["/ui/overview/live", *([job_path] if job_path else [])]
        tasks = [asyncio.create_task(follow(path)) for path in paths]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return seen


async def _resume_all(url: str, paths: list[str]) -> None:
    """Resume every session asynchronously and wait for each (a loaded machine outlasts a sync wait)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(path: str) -> None:
            job = (await client.post(f"{path}/resume", headers={"Prefer": "respond-async"})).json()
            while job["state"] in ("queued", "running"):
                job = (await client.get(f"/v1/jobs/{job['id']}", params={"wait": 30})).json()
            if job["state"] != "succeeded":
                raise RuntimeError(f"resume {path}: {job}")

        await asyncio.gather(*(one(p) for p in paths))


async def _viewer_cpu(fleet: Any, e2e: Any, job_stream: str | None, seconds: float) -> dict[str, float]:
    """API CPU per second of an idle fleet without, then with, one viewer: what watching costs,
    in a figure that does not depend on the machine's load the way throughput does."""
    figures: dict[str, float] = {}
    for viewing in (False, True):
        stop = asyncio.Event()
        viewer = asyncio.create_task(_view(fleet.url, stop, job_stream)) if viewing else None
        await asyncio.sleep(1.0)  # the streams are open and past their first answer
        cpu0 = e2e.cpu_by_role(fleet.process.pid)
        await asyncio.sleep(seconds)
        cpu1 = e2e.cpu_by_role(fleet.process.pid)
        stop.set()
        if viewer is not None:
            await viewer
        ms = (cpu1.get("api", 0.0) - cpu0.get("api", 0.0)) * 1000 / seconds
        figures[f"idle_api_cpu_ms_per_s{'_viewer' if viewing else ''}"] = ms
    cost = figures["idle_api_cpu_ms_per_s_viewer"] - figures["idle_api_cpu_ms_per_s"]
    figures["viewer_api_cpu_ms_per_s"] = cost
    print(f"idle fleet, API CPU: {figures['idle_api_cpu_ms_per_s']:.2f} ms/s without a viewer, "
          f"{figures['idle_api_cpu_ms_per_s_viewer']:.2f} ms/s with one: the viewer costs {cost:.2f} ms of "
          f"API CPU per second ({cost / 10:.2f}% of one core)")
    return figures


async def viewer_bench(args: argparse.Namespace) -> dict[str, float]:
    bench_async = importlib.import_module("bench.async")
    e2e = importlib.import_module("bench.e2e")
    with e2e.running_fleet("bench-ui-viewer-") as fleet:
        figures = await _viewer_cpu(fleet, e2e, None, args.idle_s)
        if args.pairs:
            sids = [f"uv-{i}-{uuid.uuid4().hex[:8]}" for i in range(args.sessions_viewer)]
            await _resume_all(fleet.url, [e2e.session_path(sid) for sid in sids])
            async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as client:
                sent = await client.post(e2e.session_path(sids[0]), headers={"Prefer": "respond-async"},
                                         json=e2e.tool_call("bash", {"command": "sleep 3600"}))
                long_job = sent.json()["id"]
            figures.update(await _pairs(fleet, bench_async, sids[1:], f"/ui/jobs/{long_job}/live", args))
    return figures


async def _pairs(fleet: Any, bench_async: Any, sids: list[str], job_stream: str,
                 args: argparse.Namespace) -> dict[str, float]:
    """The async submit phase without and with a viewer, interleaved; medians and the cost."""
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for pair in range(args.pairs):
        for viewing in (False, True) if pair % 2 == 0 else (True, False):
            stop = asyncio.Event()
            viewer = asyncio.create_task(_view(fleet.url, stop, job_stream)) if viewing else None
            one = await bench_async.submit_phase(fleet, sids, args.jobs)
            stop.set()
            events = await viewer if viewer is not None else 0
            results[viewing].append(one)
            print(f"  {'with' if viewing else 'no  '} viewer: submit {one['submit_per_s']:6.0f}/s, "
                  f"complete {one['per_s']:6.0f}/s"
                  + (f" ({events} UI events received)" if viewing else ""))
    figures: dict[str, float] = {}
    for key in ("submit_per_s", "per_s"):
        base = statistics.median(r[key] for r in results[False])
        viewed = statistics.median(r[key] for r in results[True])
        name = "submit" if key == "submit_per_s" else "complete"
        figures[f"{name}_per_s_no_viewer"], figures[f"{name}_per_s_viewer"] = base, viewed
        figures[f"{name}_cost"] = (base - viewed) / base
    print(f"one viewer costs {figures['submit_cost'] * 100:.1f}% of submits/s and "
          f"{figures['complete_cost'] * 100:.1f}% of completions/s (medians of {args.pairs}; "
          f"target <= {TARGET_VIEWER_COST * 100:.0f}%)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=100_000,
                        help="jobs seeded (pages) or per session (--viewer)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--viewer", action="store_true", help="measure one viewer's cost instead")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--viewer-sessions", type=int, default=100, help="--viewer: sessions submitting")
    parser.add_argument("--idle-s", type=float, default=20.0, help="--viewer: seconds of idle CPU sampled")
    args = parser.parse_args()
    if args.viewer:
        args.sessions_viewer = args.viewer_sessions + 1  # the first holds the job page's running job
        args.jobs = 50 if args.jobs == 100_000 else args.jobs
        figures = asyncio.run(viewer_bench(args))
    else:
        figures = pages_bench(args)
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
