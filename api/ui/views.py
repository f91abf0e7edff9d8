"""What each UI page shows, read from Redis in bounded amounts (pages answer in ≤ 200 ms whatever
the fleet's size: every read is a page, a capped index or a single key, never a keyspace scan)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from api.fleet import Fleet
from api.session_view import session_view
from common.capacity import Capacity
from common.fleet_stats import FleetStats, Point
from common.job_json import rfc3339
from common.queue import JobRecord, JobState
from common.queue.dlq import DeadLetter, DeadLetters
from common.queue.keys import session_name
from common.queue.models import text
from common.queue.queue import job_id_created_s

#: Rows per page of sessions, jobs and DLQ entries.
PAGE_ROWS = 50
#: Sessions a filtered listing looks at per page at most (the next page goes on from there).
SESSION_SCAN_MAX = 500
#: Jobs a state-filtered search looks at per page at most.
JOB_SCAN_MAX = 500
#: Jobs on a session's timeline, drift events in its lifecycle.
TIMELINE_JOBS = 50
LIFECYCLE_DRIFTS = 20
#: Output entries a job page shows before it goes live.
OUTPUT_ENTRIES = 1000

#: Job-hash fields a list row shows (short names, see enqueue.lua).
_ROW_FIELDS = ("s", "k", "st", "ct", "sa", "fa", "at")
#: Session-hash fields a list row shows.
_SESSION_FIELDS = ("state", "own", "last_activity")


def stats_of(fleet: Fleet) -> FleetStats:
    return FleetStats(fleet.redis, fleet.queue.keys)


@dataclass(frozen=True)
class Overview:
    """The fleet at a glance; `points` are the last 15 minutes, every 10 s."""

    workers: int
    free_slots: int
    busy_sessions: int
    sessions: dict[str, int]
    sessions_with_work: int
    waiting_for_worker: int
    oldest_wait_s: float | None
    dlq_size: int
    webhook_backlog: int
    points: list[Point]
    capacity: dict[str, Any]

    @property
    def failures(self) -> int:
        return round(sum(p.failed_per_s for p in self.points) * 10)

    @property
    def drifts(self) -> int:
        return sum(p.drifts for p in self.points)

    @property
    def calls_per_s(self) -> float:
        """Over the last complete minute."""
        return sum(p.calls_per_s for p in self.points[-6:]) / 6


async def overview(fleet: Fleet) -> Overview:
    k, redis = fleet.queue.keys, fleet.redis
    counts, idle, oldest = await asyncio.gather(
        asyncio.gather(redis.hlen(k.idle_until), redis.zcard(k.active), redis.zcard(k.work),
                       redis.xlen(k.ready), redis.xlen(k.dlq)),
        redis.zrange_withscores(k.idle, 0, -1), redis.zrange_withscores(k.work, 0, 0))
    workers, busy, with_work, ready, dlq = counts
    points, sessions, backlog, capacity = await asyncio.gather(
        stats_of(fleet).series(), stats_of(fleet).sessions_by_state(), webhook_backlog(fleet),
        Capacity(fleet.redis, fleet.config).view())
    oldest_s = time.time() - oldest[0][1] / 1000 if oldest else None
    return Overview(workers=int(workers), free_slots=int(sum(s for _, s in idle)), busy_sessions=int(busy),
                    sessions=sessions, sessions_with_work=int(with_work), waiting_for_worker=int(ready),
                    oldest_wait_s=oldest_s, dlq_size=int(dlq), webhook_backlog=backlog, points=points,
                    capacity=capacity)


#: Undelivered callbacks counted at most (the page says "1000+").
BACKLOG_COUNT_MAX = 1000


async def webhook_backlog(fleet: Fleet) -> int:
    """Callbacks not yet handed to the deliverer, plus those handed and not acknowledged."""
    key = fleet.queue.keys.callbacks
    try:
        groups = await fleet.redis.xinfo_groups(key)
    except Exception:  # no stream yet (no job had a callback): nothing is waiting
        return 0
    group = next((g for g in groups if text(g["name"]) == "webhooks"), None)
    if group is None:
        return int(await fleet.redis.xlen(key))
    after = text(group["last-delivered-id"])
    undelivered = await fleet.redis.xrange(key, min=f"({after}", count=BACKLOG_COUNT_MAX)
    return int(group["pending"]) + len(undelivered)


async def session_rows(fleet: Fleet, env: str, state: str, owner: str, cursor: str
                       ) -> tuple[list[dict[str, str]], str | None]:
    """Sessions of `env` matching the filters, in id order after `cursor`; (rows, next cursor).

    Looks at `SESSION_SCAN_MAX` sessions at most, so a rare state may take several pages."""
    ids, _ = await fleet.queue.list_sessions(env, cursor, SESSION_SCAN_MAX if state or owner else PAGE_ROWS)
    fields = await asyncio.gather(*(fleet.redis.hmget(fleet.queue.keys.session(session_name(env, sid)),
                                                      _SESSION_FIELDS) for sid in ids))
    rows: list[dict[str, str]] = []
    last = None
    for sid, values in zip(ids, fields, strict=True):
        last = sid
        row = {"session": sid,
               **{f: text(v) if v else "" for f, v in zip(_SESSION_FIELDS, values, strict=True)}}
        row["state"] = row["state"] or "new"
        if (not state or row["state"] == state) and (not owner or row["own"] == owner):
            rows.append(row)
            if len(rows) == PAGE_ROWS:
                break
    more = len(rows) == PAGE_ROWS or len(ids) == SESSION_SCAN_MAX
    return rows, (last if more and last is not None else None)


async def job_rows(fleet: Fleet, job_ids: list[str]) -> list[dict[str, Any]]:
    """List rows of these jobs (the ones that still exist), in the order given."""
    keys = fleet.queue.keys
    fields = await asyncio.gather(*(fleet.redis.hmget(keys.job(jid), _ROW_FIELDS) for jid in job_ids))
    rows = []
    for jid, values in zip(job_ids, fields, strict=True):
        f = {name: text(v) for name, v in zip(_ROW_FIELDS, values, strict=True) if v is not None}
        if "st" in f:
            rows.append(_job_row(jid, f))
    return rows


def _job_row(jid: str, f: dict[str, str]) -> dict[str, Any]:
    def at(name: str) -> float | None:
        return int(f[name]) / 1000 if f.get(name) else None

    created, started, finished = at("ct"), at("sa"), at("fa")
    return {"id": jid, "session": f.get("s", ""), "kind": f.get("k", ""), "state": f["st"],
            "created": rfc3339(created), "attempts": int(f.get("at") or 0),
            "queued_ms": _ms_between(created, started), "ran_ms": _ms_between(started, finished),
            "created_s": created, "started_s": started, "finished_s": finished}


def _ms_between(a: float | None, b: float | None) -> float | None:
    return round((b - a) * 1000, 1) if a is not None and b is not None else None


async def jobs_by_state(fleet: Fleet, state: str, before_ms: int | None
                        ) -> tuple[list[dict[str, Any]], int | None]:
    """Recent jobs in `state`, newest first, enqueued before `before_ms`; (rows, next cursor).

    Queued and running jobs are found from the sessions with work; the others in the recent index,
    looking at `JOB_SCAN_MAX` jobs per page at most."""
    if state in (JobState.QUEUED, JobState.RUNNING):
        return await _live_jobs(fleet, state), None
    limit = JOB_SCAN_MAX if state else PAGE_ROWS
    ids = await stats_of(fleet).recent_jobs(before_ms, limit)
    rows = [r for r in await job_rows(fleet, ids) if not state or r["state"] == state][:PAGE_ROWS]
    if len(rows) == PAGE_ROWS:
        return rows, int(rows[-1]["created_s"] * 1000)
    last_created = job_id_created_s(ids[-1]) if len(ids) == limit else None
    return rows, (int(last_created * 1000) if last_created is not None else None)


async def _live_jobs(fleet: Fleet, state: str) -> list[dict[str, Any]]:
    """Head jobs of the sessions with work (running ones first in `active`, waiting ones in `work`)."""
    k = fleet.queue.keys
    index = k.active if state == JobState.RUNNING else k.work
    sessions = await fleet.redis.zrange(index, 0, PAGE_ROWS - 1)
    last = 0 if state == JobState.RUNNING else 1
    fifos = await asyncio.gather(*(fleet.redis.lrange(k.fifo(text(s)), 0, last) for s in sessions))
    ids = [text(j) for heads in fifos for j in heads]
    return [r for r in await job_rows(fleet, ids) if r["state"] == state][:PAGE_ROWS]


async def session_detail(fleet: Fleet, env: str, sid: str) -> dict[str, Any] | None:
    environment = fleet.environment(env)
    session = session_name(env, sid)
    stats = stats_of(fleet)
    view, info, job_ids, drifts, queued = await asyncio.gather(
        session_view(fleet.queue, environment, sid), fleet.queue.get_session(env, sid),
        stats.session_jobs(session, TIMELINE_JOBS), stats.session_drifts(session, LIFECYCLE_DRIFTS),
        fleet.redis.lrange(fleet.queue.keys.fifo(session), 0, TIMELINE_JOBS - 1))
    if view is None:
        return None
    ids = list(dict.fromkeys([text(j) for j in queued] + job_ids))[:TIMELINE_JOBS]
    jobs = sorted(await job_rows(fleet, ids), key=lambda r: r["created_s"] or 0)
    lifecycle = [{"at": r["created"], "what": f"{r['kind']} job {r['state']}", "job": r["id"]}
                 for r in jobs if r["kind"] != "tool"]
    lifecycle += [{"at": rfc3339(d["ts_ms"] / 1000), "what": f"drift: {d['drift']} {d['detail']}",
                   "job": None} for d in drifts]
    lifecycle.sort(key=lambda e: e["at"] or "")
    return {"view": view, "info": info or {}, "jobs": jobs, "lifecycle": lifecycle,
            "timeline": timeline(jobs)}


def timeline(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bars for the jobs' queued and running spans, as percentages of the whole span shown."""
    times = [t for r in jobs for t in (r["created_s"], r["finished_s"] or r["started_s"]) if t]
    if not times:
        return []
    running = any(not r["finished_s"] for r in jobs)
    start, end = min(times), max(*times, time.time()) if running else max(times)
    span = max(end - start, 1e-3)

    def pct(t: float | None) -> float:
        return float(round(((t if t is not None else end) - start) / span * 100, 2))

    return [{"job": r, "x": pct(r["created_s"]), "run_x": pct(r["started_s"] or r["created_s"]),
             "end_x": pct(r["finished_s"])} for r in jobs]


async def job_detail(fleet: Fleet, job: JobRecord) -> dict[str, Any]:
    """The job's request (names of its env variables, never values), timings and output so far."""
    output = await fleet.queue.read_output(job.id, count=OUTPUT_ENTRIES)
    raw = await fleet.redis.hmget(fleet.queue.keys.job(job.id), ["lr", "rp"])
    last_reason, replayed = (text(v) if v else None for v in raw)
    return {"job": job, "output": [(i, f) for i, f in output if f.get("event") != "end"],
            "last_output_id": output[-1][0] if output else "0-0",
            "queued_ms": _ms_between(job.created_at, job.started_at),
            "ran_ms": _ms_between(job.started_at, job.finished_at),
            "last_retry_reason": last_reason,
            "replayed_at": rfc3339(int(replayed) / 1000) if replayed else None}


async def dlq_rows(fleet: Fleet, cursor: str | None) -> tuple[list[DeadLetter], str | None, int]:
    dlq = DeadLetters(fleet.queue)
    page, next_cursor = await dlq.page(cursor, PAGE_ROWS)
    return page, next_cursor, await dlq.size()
