"""Soak benchmark: the whole fleet at a steady load, for memory and disk that stay bounded.

Starts `atefleet --config CFG up` (as bench/e2e.py does: shipped worker defaults) with retention
shortened in the shipped proportions, so steady state comes within the run: `jobs.ttl_s` = a fifth
of the run, and every other retention (events, output streams, idempotency keys, the audit
stream's age and trim period) the same share of its shipped default as that is of 24 h; GC every
ttl/10. Then, for `--minutes`, `--sessions` sessions send sync `echo` calls back to back and as
many others submit async ones (`Prefer: respond-async`) and long-poll each (`?wait=30`), one
connection each (as the issue's orchestrator did). Every 2 s it samples Redis's `used_memory`,
each role's RSS, the AOF's size and the state dir's disk use.

Figures: `soak_calls`, `soak_errors`, `soak_calls_per_s`; `redis_bytes_per_finished_call` = Redis
`used_memory` over the unloaded start, less the keys capped by a count whatever the rate
(`CAPPED_KINDS`: `redis_capped_bytes`), / finished job records held at the end: each record's share
of everything the calls keep (record, the main and expires dicts' entries, folded output, events,
audit, the per-session UI indexes, allocator rounding); `..._with_capped` counts those keys too
(in a short run they hold more ids than a minute of calls: their share shrinks as records held
grow). `calls_in_last_ttl` checks the denominator (records held ≈ the calls of the last ttl).
The breakdown printed before the figures: MEMORY STATS at the start and the end (dataset,
overheads, the main and expires dicts, client and AOF buffers, Lua caches, the allocator), and
each key kind's count and MEMORY USAGE (sampled), per record held; `job_record_encodings` (a
record should stay ziplist / listpack) and one record's field sizes. `redis_used_mb_start/end`;
`redis_slope_mb_per_min` and `rss_slope_mb_per_min` (per role) by least squares over the run's
last half, with `*_slope_ci_mb_per_min` the 95% half-width from the fit's residuals (sampling
noise: allocator and AOF buffers, GC passes); a slope counts as flat (`*_flat`: not growing) when
that band reaches 0 or below, or it raises the level by less than 1% over the half. Records held
are the call rate × ttl, and the rate swings with the machine's load, so
`redis_bytes_per_key_slope_per_min` (used_memory / DBSIZE, same fit) tells a leak from a change
of rate. `aof_mb_end`, `disk_mb_end`.

    .venv/bin/python bench/soak.py [--minutes 10] [--sessions 3] [--rate CALLS_PER_S]

With `--rate`, the sessions together make that many calls per second (while they can): the
records held stay at rate x ttl, so the slopes judge boundedness even on a machine whose load
swings (without it, each session calls as fast as it goes and the rate follows the load).

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
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import redis.asyncio as aioredis  # noqa: E402

from bench.e2e import Conn, fleet_children, fleet_config, load_average, rss_mb, session_path, tool_call  # noqa: E402
from common.config import AuditConfig, JobsConfig  # noqa: E402
from common.fleet_stats import RECENT_JOBS_MAX  # noqa: E402
from tests.e2e.conftest import RunningFleet, start_fleet  # noqa: E402

#: Keys whose size is capped by a count, whatever the call rate or retention: not a cost per call
#: (`stats:jobs`, the UI's fleet-wide index of the last `RECENT_JOBS_MAX` job ids, ~1.3 MB full).
CAPPED_KINDS = ("stats:jobs",)
#: Issue 20's targets, printed next to the figures.
TARGET_BYTES_PER_CALL = 500
SAMPLE_EVERY_S = 2.0
ASYNC = {"Prefer": "respond-async"}


def soak_config(tmp: Path, run_s: float) -> dict[str, Any]:
    """The fleet's config with every retention the shipped default's share of `jobs.ttl_s`."""
    ttl_s = run_s / 5
    jobs, audit = JobsConfig(), AuditConfig()

    def scaled(default_s: float) -> float:
        return max(1.0, ttl_s * default_s / jobs.ttl_s)

    cfg = fleet_config(tmp, slots=16)
    cfg["jobs"] = {
        **cfg.get("jobs", {}),
        "ttl_s": ttl_s,
        "events_ttl_s": scaled(jobs.events_ttl_s),
        "output_ttl_s": scaled(jobs.output_ttl_s),
        "idempotency_ttl_s": scaled(jobs.idempotency_ttl_s),
    }
    cfg["audit"] = {"max_age_s": scaled(audit.max_age_s), "trim_period_s": scaled(audit.trim_period_s)}
    cfg["reconciler"] = {**cfg.get("reconciler", {}), "gc_period_s": max(1.0, ttl_s / 10)}
    for env in cfg["environments"]:
        env["idle_timeout_s"] = 0  # the sessions are busy; nothing to park
    return cfg


def echo(n: int) -> dict[str, Any]:
    return tool_call("bash", {"command": f"echo {n}"})


def fleet_redis(fleet: RunningFleet) -> aioredis.Redis:
    d = fleet.state_dir / "redis"
    return aioredis.Redis(
        host="127.0.0.1", port=int((d / "port").read_text()), password=(d / "password").read_text().strip()
    )


def disk_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total / 1e6


class Counts:
    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.first_errors: list[str] = []

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(what[:300])


async def paced(started: float, n: int, per_s: float) -> None:
    """With a rate (`--rate`), wait for call `n`'s time: a steady rate holds as many records as
    rate x ttl, so Redis's slope says whether memory is bounded, whatever the machine's load."""
    if per_s > 0:
        await asyncio.sleep(max(0.0, started + n / per_s - time.monotonic()))


async def sync_loop(fleet: RunningFleet, sid: str, until: float, counts: Counts, per_s: float) -> None:
    conn = await Conn.tcp(fleet.url)
    n = 0
    started = time.monotonic()
    while time.monotonic() < until:
        await paced(started, n, per_s)
        try:
            status, answer = await conn.request("POST", session_path(sid), echo(n))
            if status != 200 or answer.get("output") != f"{n}\n":
                counts.error(f"sync {status} {answer}")
            counts.calls += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            counts.error(f"sync {err!r}")
            conn = await Conn.tcp(fleet.url)
        n += 1
    await conn.close()


async def async_loop(fleet: RunningFleet, sid: str, until: float, counts: Counts, per_s: float) -> None:
    conn = await Conn.tcp(fleet.url)
    n = 0
    started = time.monotonic()
    while time.monotonic() < until:
        await paced(started, n, per_s)
        try:
            status, job = await conn.request("POST", session_path(sid), echo(n), headers=ASYNC)
            if status != 202:
                counts.error(f"submit {status} {job}")
            else:
                status, done = await conn.request("GET", f"/v1/jobs/{job['id']}?wait=30")
                result = (done or {}).get("result") or {}
                if status != 200 or done["state"] != "succeeded" or result.get("output") != f"{n}\n":
                    counts.error(f"poll {status} {done}")
            counts.calls += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            counts.error(f"async {err!r}")
            conn = await Conn.tcp(fleet.url)
        n += 1
    await conn.close()


def slope_per_min(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope (units/min) of (t_s, value) and the 95% half-width of its estimate."""
    n = len(samples)
    if n < 3:
        return 0.0, math.inf
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    sxx = sum((t - mt) ** 2 for t, _ in samples)
    slope = sum((t - mt) * (v - mv) for t, v in samples) / sxx
    residual = sum((v - mv - slope * (t - mt)) ** 2 for t, v in samples) / (n - 2)
    return slope * 60, 1.96 * math.sqrt(residual / sxx) * 60


def flat(samples: list[tuple[float, float]], slope: float, ci: float) -> bool:
    """Not growing, within noise: the slope's band reaches 0 or below (a level that falls is
    bounded too), or it raises the level by < 1% over the samples."""
    span_min = (samples[-1][0] - samples[0][0]) / 60
    level = sum(v for _, v in samples) / len(samples)
    return slope <= ci or slope * span_min < 0.01 * level


async def sample(fleet: RunningFleet, r: aioredis.Redis, t0: float) -> dict[str, Any]:
    by_role: dict[str, float] = {}
    for pid, role in fleet_children(fleet.process.pid).items():
        try:
            by_role[role] = by_role.get(role, 0.0) + rss_mb(pid)
        except (OSError, StopIteration):
            pass
    aof = fleet.state_dir / "redis" / "appendonly.aof"
    return {
        "t": time.monotonic() - t0,
        "used": int((await r.info("memory"))["used_memory"]),
        "keys": int(await r.dbsize()),  # ~ records held: all but a few dozen keys are records
        "rss": by_role,
        "aof": aof.stat().st_size if aof.exists() else 0,
    }


async def count_keys(r: aioredis.Redis, pattern: str) -> int:
    return sum([1 async for _ in r.scan_iter(match=pattern, count=5000)])


#: MEMORY STATS fields the breakdown prints (Redis 6.2 and 7 name them alike).
MEMORY_STATS = (
    "dataset.bytes",
    "overhead.total",
    "keys.count",
    "overhead.hashtable.main",
    "overhead.hashtable.expires",
    "clients.normal",
    "aof.buffer",
    "lua.caches",
    "allocator.allocated",
    "allocator.active",
    "allocator-fragmentation.bytes",
)
#: Keys per kind whose MEMORY USAGE is read (all of a kind with fewer).
USAGE_SAMPLE = 300


async def memory_stats(r: aioredis.Redis) -> dict[str, float]:
    """MEMORY STATS as a flat dict of the fields above (db.0's overheads lifted out)."""
    raw = await r.execute_command("MEMORY", "STATS")
    flat: dict[str, Any] = {}
    for name, value in zip(raw[::2], raw[1::2], strict=True):
        name = name.decode()
        if isinstance(value, list):  # db.0: [overhead.hashtable.main, n, overhead.hashtable.expires, n]
            flat.update({k.decode(): v for k, v in zip(value[::2], value[1::2], strict=True)})
        else:
            flat[name] = value
    return {k: float(flat[k]) for k in MEMORY_STATS if k in flat}


def key_kind(key: bytes) -> str:
    """`af:job:1a2b…` → `job`, `af:stats:sjobs:{env/sid}` → `stats:sjobs`: the name up to its id."""
    kind = []
    for part in key.decode(errors="replace").split(":")[1:]:
        if "{" in part or any(c.isdigit() for c in part) or len(part) >= 16:
            break
        kind.append(part)
    return ":".join(kind) or "?"


async def usage_by_kind(r: aioredis.Redis) -> dict[str, dict[str, int]]:
    """Keys by kind: how many, how many with a TTL, and their MEMORY USAGE (SAMPLES 0: every
    element counted), read for up to USAGE_SAMPLE keys of a kind and scaled to all of them."""
    kinds: dict[str, list[bytes]] = {}
    async for key in r.scan_iter(count=5000):
        kinds.setdefault(key_kind(key), []).append(key)
    out = {}
    for kind, keys in sorted(kinds.items()):
        sample = keys[:: max(1, len(keys) // USAGE_SAMPLE)][:USAGE_SAMPLE]
        usage = [await r.memory_usage(k, samples=0) or 0 for k in sample]
        with_ttl = sum([await r.pttl(k) > 0 for k in sample])
        out[kind] = {
            "keys": len(keys),
            "bytes": round(sum(usage) / len(sample) * len(keys)),
            "with_ttl": round(with_ttl / len(sample) * len(keys)),
        }
    return out


async def record_encodings(r: aioredis.Redis, n: int = 200) -> dict[str, int]:
    """OBJECT ENCODING of up to `n` job records: a hashtable one costs several times a compact one."""
    seen: dict[str, int] = {}
    async for key in r.scan_iter(match="af:job:*", count=1000):
        enc = await r.object("encoding", key)
        if enc is None:  # expired since the scan
            continue
        seen[enc.decode()] = seen.get(enc.decode(), 0) + 1
        if sum(seen.values()) >= n:
            break
    return seen


def print_breakdown(
    stats_start: dict[str, float], stats_end: dict[str, float], kinds: dict[str, dict[str, int]], held: int
) -> None:
    """Where Redis's memory went, per finished record held: MEMORY STATS deltas, then by key kind."""
    print(f"redis memory, per finished record held ({held}):")
    for name in MEMORY_STATS:
        if name in stats_end:
            delta = stats_end[name] - stats_start.get(name, 0.0)
            print(
                f"  {name:32} {stats_end[name]:14,.0f}  delta {delta:12,.0f}  "
                f"per record {delta / max(held, 1):8.1f}"
            )
    print("by key kind (MEMORY USAGE; the main and expires dicts' entries not included):")
    for kind, k in sorted(kinds.items(), key=lambda kv: -kv[1]["bytes"]):
        print(
            f"  {kind:28} keys {k['keys']:8,}  ttl {k['with_ttl']:8,}  bytes {k['bytes']:12,}  "
            f"per record {k['bytes'] / max(held, 1):8.1f}"
        )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    run_s = args.minutes * 60
    tmp = Path(tempfile.mkdtemp(prefix="af-soak-"))
    fleet = start_fleet(tmp, soak_config(tmp, run_s))
    r = fleet_redis(fleet)
    try:
        print(f"load average at start: {load_average()}", flush=True)
        sids = [f"soak-{i}" for i in range(2 * args.sessions)]
        for sid in sids:
            conn = await Conn.tcp(fleet.url)
            status, body = await conn.request("POST", f"{session_path(sid)}/resume")
            await conn.close()
            if status != 200:
                raise RuntimeError(f"resume {sid}: {status} {body}")
        used_start = int((await r.info("memory"))["used_memory"])
        stats_start = await memory_stats(r)
        counts = Counts()
        t0 = time.monotonic()
        until = t0 + run_s
        per_loop = args.rate / len(sids)
        loops = [asyncio.create_task(sync_loop(fleet, s, until, counts, per_loop))
                 for s in sids[: args.sessions]]  # fmt: skip
        loops += [asyncio.create_task(async_loop(fleet, s, until, counts, per_loop))
                  for s in sids[args.sessions :]]  # fmt: skip
        samples = []
        while time.monotonic() < until:
            samples.append({**await sample(fleet, r, t0), "calls": counts.calls})
            s = samples[-1]
            rss = {k: round(v) for k, v in sorted(s["rss"].items())}
            print(
                f"t={s['t']:6.1f}s calls={counts.calls} errors={counts.errors} "
                f"redis={s['used'] / 1e6:.1f} MB rss={rss}",
                flush=True,
            )
            await asyncio.sleep(SAMPLE_EVERY_S)
        await asyncio.gather(*loops)
        elapsed = time.monotonic() - t0
        samples.append({**await sample(fleet, r, t0), "calls": counts.calls})
        jobs_held = await count_keys(r, "af:job:*")
        used_end = samples[-1]["used"]
        stats_end = await memory_stats(r)
        kinds = await usage_by_kind(r)
        print_breakdown(stats_start, stats_end, kinds, jobs_held)
        job_key = next(iter([k async for k in r.scan_iter(match="af:job:*", count=1000)]), None)
        ttl_s = soak_config(tmp, run_s)["jobs"]["ttl_s"]
        # The denominator: records held should be the calls of the last `ttl_s` (+ the resumes).
        before_ttl = [s["calls"] for s in samples if s["t"] <= elapsed - ttl_s]
        per_kind = {kind: round(k["bytes"] / max(jobs_held, 1), 1) for kind, k in kinds.items()}
        breakdown = {
            "calls_in_last_ttl": counts.calls - (before_ttl[-1] if before_ttl else 0),
            "redis_bytes_per_record_by_kind": per_kind,
            "memory_stats_delta_per_record": {
                name: round((stats_end[name] - stats_start.get(name, 0.0)) / max(jobs_held, 1), 1)
                for name in stats_end
            },
            "job_record_encodings": await record_encodings(r),
            "job_record_fields": {k.decode(): len(v) for k, v in (await r.hgetall(job_key)).items()}
            if job_key
            else None,
            "output_streams": kinds.get("out", {}).get("keys", 0),
            "keys": await r.dbsize(),
        }
    finally:
        await r.aclose()
        fleet.stop()
    half = [s for s in samples if s["t"] >= run_s / 2]
    redis_series = [(s["t"], s["used"] / 1e6) for s in half]
    redis_slope, redis_ci = slope_per_min(redis_series)
    # Memory follows records held (the call rate × ttl), and the rate follows the machine's load:
    # per key, a leak still shows as a slope, a change of rate does not.
    per_key_series = [(s["t"], s["used"] / max(s["keys"], 1)) for s in half]
    per_key_slope, per_key_ci = slope_per_min(per_key_series)
    rss_slopes, rss_ci, rss_flat = {}, {}, {}
    for role in sorted({k for s in half for k in s["rss"]}):
        series = [(s["t"], s["rss"][role]) for s in half if role in s["rss"]]
        rss_slopes[role], rss_ci[role] = (round(x, 3) for x in slope_per_min(series))
        rss_flat[role] = flat(series, rss_slopes[role], rss_ci[role])
    capped = sum(kinds.get(kind, {}).get("bytes", 0) for kind in CAPPED_KINDS)
    figures = {
        "soak_minutes": args.minutes,
        "soak_calls": counts.calls,
        "soak_errors": counts.errors,
        "soak_calls_per_s": round(counts.calls / elapsed, 1),
        "redis_bytes_per_finished_call": round((used_end - used_start - capped) / max(jobs_held, 1)),
        "redis_bytes_per_finished_call_with_capped": round((used_end - used_start) / max(jobs_held, 1)),
        "redis_capped_bytes": capped,
        "redis_capped_kinds": {kind: RECENT_JOBS_MAX for kind in CAPPED_KINDS},
        "finished_records_held": jobs_held,
        "redis_used_mb_start": round(used_start / 1e6, 2),
        "redis_used_mb_end": round(used_end / 1e6, 2),
        "redis_slope_mb_per_min": round(redis_slope, 3),
        "redis_slope_ci_mb_per_min": round(redis_ci, 3),
        "redis_flat": flat(redis_series, redis_slope, redis_ci),
        "redis_bytes_per_key_slope_per_min": round(per_key_slope, 2),
        "redis_bytes_per_key_slope_ci_per_min": round(per_key_ci, 2),
        "redis_bytes_per_key_flat": flat(per_key_series, per_key_slope, per_key_ci),
        "rss_slope_mb_per_min": rss_slopes,
        "rss_slope_ci_mb_per_min": rss_ci,
        "rss_flat": rss_flat,
        "aof_mb_end": round(samples[-1]["aof"] / 1e6, 2),
        "disk_mb_end": round(disk_mb(tmp), 1),
        **breakdown,
        "target_bytes_per_call": TARGET_BYTES_PER_CALL,
        "load_average_end": load_average(),
    }
    shutil.rmtree(tmp, ignore_errors=True)
    if counts.first_errors:
        print("first errors:", *counts.first_errors, sep="\n  ")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=3, help="sync sessions; as many async ones")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="calls/s in all, spread over the sessions (0: each as fast as it goes)")
    figures = asyncio.run(run(parser.parse_args()))
    for key, value in figures.items():
        print(f"{key}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
