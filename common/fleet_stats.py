"""The fleet's own recent history, kept in Redis for the operator UI: counters per 10 s, and indexes.

Nothing on the request path writes these. The reconciler leader folds the `events` stream (which
every job state change and drift already goes to) into them once per period (`StatsPass`):

- `stats:s:{start}`: per `BUCKET_S` seconds from `start` (unix s), jobs ended by state
  (`succeeded`, `failed`, `cancelled`), enqueued (`queued`, first attempts only), drifts (`drift`),
  and a latency histogram of the ended jobs (`l{bucket}`: enqueue → end, read from the job id's
  creation time); kept `WINDOW_S` + slack. A chart of the window reads `WINDOW_S / BUCKET_S` hashes
  (90): per-second hashes made the overview read 900, a third of its answer time;
- `stats:jobs` and `stats:sjobs:{session}`: the most recent job ids fleet-wide and per session
  (job search and a session's timeline without scanning the keyspace), capped;
- `stats:drifts:{session}`: a session's drift events, capped;
- `stats:sessions`: sessions by state, recounted every `SESSION_COUNT_PERIOD_S` over at most
  `SESSION_COUNT_MAX` sessions.

`FleetStats` reads them back as chart series. A pass reads at most `FOLD_MAX` events; a fleet
producing more than that per period catches up over the next ones (the charts lag, nothing is lost
while the entries are still in the stream).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.config import Config
from common.queue.keys import Keys
from common.queue.models import text
from common.queue.queue import job_id_created_s
from common.redis.client import RedisClient

#: Seconds of history the charts show (15 minutes).
WINDOW_S = 900
#: Seconds one counter hash covers (one chart point).
BUCKET_S = 10
#: A bucket's counters live this long (s): the window plus slack for a lagging reader.
BUCKET_TTL_S = WINDOW_S + 120
#: Events folded per pass at most.
FOLD_MAX = 50_000
#: Job ids kept in the fleet-wide recent index, and per session.
RECENT_JOBS_MAX = 10_000
SESSION_JOBS_MAX = 200
#: Drift events kept per session.
SESSION_DRIFTS_MAX = 50
#: Per-session indexes expire this long (s) after their last write (as long as jobs are kept at most).
SESSION_INDEX_TTL_S = 86_400
#: Sessions by state are recounted this often (s), over at most this many sessions.
SESSION_COUNT_PERIOD_S = 15.0
SESSION_COUNT_MAX = 100_000
#: Histogram buckets per doubling of latency: bucket b holds latencies up to 2**(b/4) ms (~19% wide).
BUCKETS_PER_DOUBLING = 4

_TERMINAL = ("succeeded", "failed", "cancelled")


def latency_bucket(latency_ms: float) -> int:
    """The histogram bucket of a latency: the smallest b with latency ≤ 2**(b/4) ms (0 below 1 ms)."""
    if latency_ms <= 1:
        return 0
    return math.ceil(math.log2(latency_ms) * BUCKETS_PER_DOUBLING)


def bucket_upper_ms(bucket: int) -> float:
    return float(2 ** (bucket / BUCKETS_PER_DOUBLING))


def quantile_ms(histogram: Mapping[int, int], q: float) -> float | None:
    """The q-quantile of a bucket histogram, as its bucket's upper bound; None when empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank, seen = q * total, 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_upper_ms(bucket)
    return bucket_upper_ms(max(histogram))


#: Field names and states of `events` entries, as Redis replies them (the fold reads bytes:
#: decoding every field of every entry was half its CPU).
_DRIFT, _SESSION, _JOB, _STATE, _DETAIL = b"drift", b"session", b"job", b"state", b"detail"
_QUEUED = b"queued"
_TERMINAL_BYTES = {s.encode(): s for s in _TERMINAL}

EventFields = Mapping[bytes, bytes]


@dataclass
class Fold:
    """What a batch of `events` entries adds: counters by bucket, job ids by session, drifts."""

    buckets: defaultdict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    jobs: dict[str, int] = field(default_factory=dict)
    session_jobs: defaultdict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    drifts: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, entry_id: bytes, fields: EventFields) -> None:
        """One `events` entry; its time is its stream id's (the scripts' own clock)."""
        state = fields.get(_STATE)
        if state is not None and state != _QUEUED and state not in _TERMINAL_BYTES:
            return  # `running`: nothing to count
        ts_ms = int(entry_id.partition(b"-")[0])
        bucket = ts_ms // 1000 // BUCKET_S * BUCKET_S
        if _DRIFT in fields:
            self._drift(ts_ms, bucket, fields)
            return
        raw_jid, session = fields.get(_JOB), fields.get(_SESSION)
        if not raw_jid or not session or state is None:
            return
        jid = raw_jid.decode()
        created_s = job_id_created_s(jid)
        created_ms = int(created_s * 1000) if created_s is not None else ts_ms
        if state == _QUEUED:
            if jid not in self.jobs:
                self.jobs[jid] = created_ms
                self.session_jobs[session.decode()][jid] = created_ms
                if ts_ms - created_ms < 1000:  # a retry's or replay's re-queue is not a new job
                    self.buckets[bucket]["queued"] += 1
            return
        counter = self.buckets[bucket]
        counter[_TERMINAL_BYTES[state]] += 1
        counter[f"l{latency_bucket(ts_ms - created_ms)}"] += 1

    def _drift(self, ts_ms: int, bucket: int, fields: EventFields) -> None:
        self.buckets[bucket]["drift"] += 1
        session = fields.get(_SESSION)
        if session:
            self.drifts[session.decode()].append(json.dumps(
                {"ts_ms": ts_ms, "drift": fields[_DRIFT].decode(),
                 "detail": fields.get(_DETAIL, b"").decode(errors="replace")}))


def fold(entries: Iterable[tuple[bytes, EventFields]]) -> Fold:
    result = Fold()
    for entry_id, fields in entries:
        result.add(entry_id, fields)
    return result


@dataclass(frozen=True)
class Point:
    """One chart point: jobs ended per second and their latency over `BUCKET_S` seconds from `t`."""

    t: int
    calls_per_s: float
    failed_per_s: float
    enqueued_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    drifts: int


class FleetStats:
    """Reads the counters back (the API) and folds new events into them (the reconciler)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def series(self, now_s: float | None = None, window_s: int = WINDOW_S) -> list[Point]:
        """A point per bucket over the last `window_s` seconds, oldest first (complete buckets only)."""
        end = int(now_s if now_s is not None else time.time()) // BUCKET_S * BUCKET_S
        starts = range(end - window_s, end, BUCKET_S)
        buckets = await asyncio.gather(*(self.redis.hgetall(self.keys.stats_bucket(t)) for t in starts))
        return [_point(start, raw) for start, raw in zip(starts, buckets, strict=True)]

    async def sessions_by_state(self) -> dict[str, int]:
        raw = await self.redis.hgetall(self.keys.stats_sessions)
        return {text(k): int(v) for k, v in raw.items() if text(k) != "at"}

    async def recent_jobs(self, before_ms: int | None, limit: int) -> list[str]:
        """Job ids of the recent index, newest first, enqueued strictly before `before_ms`."""
        high = f"({before_ms}" if before_ms is not None else "+inf"
        raw = await self.redis.zrevrangebyscore(self.keys.recent_jobs, high, "-inf", start=0, num=limit)
        return [text(j) for j in raw]

    async def session_jobs(self, session: str, limit: int) -> list[str]:
        raw = await self.redis.zrevrange(self.keys.session_jobs(session), 0, limit - 1)
        return [text(j) for j in raw]

    async def session_drifts(self, session: str, limit: int) -> list[dict[str, Any]]:
        raw = await self.redis.lrange(self.keys.session_drifts(session), 0, limit - 1)
        return [json.loads(text(x)) for x in raw]


def _point(t: int, raw: Mapping[Any, Any]) -> Point:
    totals: Counter[str] = Counter()
    histogram: Counter[int] = Counter()
    for k, v in raw.items():
        name, count = text(k), int(v)
        if name.startswith("l"):
            histogram[int(name[1:])] += count
        else:
            totals[name] += count
    ended = sum(totals[s] for s in _TERMINAL)
    return Point(t=t, calls_per_s=ended / BUCKET_S, failed_per_s=totals["failed"] / BUCKET_S,
                 enqueued_per_s=totals["queued"] / BUCKET_S, p50_ms=quantile_ms(histogram, 0.5),
                 p99_ms=quantile_ms(histogram, 0.99), drifts=totals["drift"])


class Examined(Protocol):
    """What a pass reports (the reconciler's PassReport)."""

    examined: int


class StatsPass:
    """The reconciler pass that folds new `events` entries into the counters and indexes."""

    def __init__(self, config: Config, redis: RedisClient, keys: Keys) -> None:
        self.config = config
        self.redis = redis
        self.keys = keys
        self._counted_at = 0.0

    async def run(self, report: Examined) -> None:
        """Fold what `events` gained since the last pass; recount sessions when due."""
        cursor = text(await self.redis.get(self.keys.stats_cursor) or b"0-0")
        entries = await self.redis.xrange(self.keys.events, min=f"({cursor}", count=FOLD_MAX)
        report.examined += len(entries)
        if entries:
            await self._write(fold(entries), text(entries[-1][0]))
        if time.monotonic() - self._counted_at >= SESSION_COUNT_PERIOD_S:
            await self._count_sessions()
            self._counted_at = time.monotonic()

    async def _write(self, folded: Fold, cursor: str) -> None:
        # Issued together, they leave in one write (the client pipelines what a loop turn sends).
        k, r = self.keys, self.redis
        writes: list[Awaitable[Any]] = []
        for start, counter in folded.buckets.items():
            key = k.stats_bucket(start)
            writes += [r.hincrby(key, name, n) for name, n in counter.items()]
            writes.append(r.expire(key, BUCKET_TTL_S))
        if folded.jobs:
            writes += [r.zadd(k.recent_jobs, _newest(folded.jobs, RECENT_JOBS_MAX)),
                       r.zremrangebyrank(k.recent_jobs, 0, -RECENT_JOBS_MAX - 1)]
        for session, jobs in folded.session_jobs.items():
            key = k.session_jobs(session)
            writes += [r.zadd(key, _newest(jobs, SESSION_JOBS_MAX)),
                       r.zremrangebyrank(key, 0, -SESSION_JOBS_MAX - 1), r.expire(key, SESSION_INDEX_TTL_S)]
        for session, drifts in folded.drifts.items():
            key = k.session_drifts(session)
            writes += [r.lpush(key, *drifts), r.ltrim(key, 0, SESSION_DRIFTS_MAX - 1),
                       r.expire(key, SESSION_INDEX_TTL_S)]
        writes.append(r.set(k.stats_cursor, cursor))
        await asyncio.gather(*writes)

    async def _count_sessions(self) -> None:
        counts: Counter[str] = Counter()
        budget = SESSION_COUNT_MAX
        for env in self.config.environments:
            ids = await self.redis.zrange(self.keys.session_index(env.name), 0, budget - 1)
            budget -= len(ids)
            sessions = [self.keys.session(f"{env.name}/{text(sid)}") for sid in ids]
            states = await asyncio.gather(*(self.redis.hget(session, "state") for session in sessions))
            counts.update(text(s) if s else "new" for s in states)
            if budget <= 0:
                break
        # Sent in one loop turn, in this order, over one connection: readers never see the hash
        # half rewritten for long (as with the pipeline this was).
        key = self.keys.stats_sessions
        await asyncio.gather(self.redis.delete(key),
                             self.redis.hset(key, {**counts, "at": int(time.time() * 1000)}))


def _newest(jobs: dict[str, int], cap: int) -> dict[str, int]:
    """The last `cap` jobs folded (the index keeps no more; writing the rest only to trim it cost)."""
    return jobs if len(jobs) <= cap else dict(list(jobs.items())[-cap:])
