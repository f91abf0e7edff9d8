"""Fleet statistics: events folded into per-second counters and indexes on real Redis, read back
as chart points; the histogram's quantiles."""

from __future__ import annotations

import redis.asyncio as aioredis

from common.config import Config
from common.fleet_stats import (
    SESSION_JOBS_MAX,
    FleetStats,
    StatsPass,
    bucket_upper_ms,
    latency_bucket,
    quantile_ms,
)
from common.queue.keys import Keys
from common.redis.client import RedisClient
from reconciler.report import PassReport

T0_MS = 1_800_000_000_000  # a whole second


def _jid(created_ms: int, n: int) -> str:
    return f"{created_ms:011x}{n:016x}"


def _config() -> Config:
    return Config.model_validate({"environments": [{"name": "e", "template": "t"}]})


def test_latency_buckets_bound_their_values_within_a_fifth() -> None:
    for ms in [0.2, 1, 1.5, 7, 100, 999, 12_345]:
        upper = bucket_upper_ms(latency_bucket(ms))
        assert ms <= upper <= max(ms, 1) * 1.19


def test_quantiles_of_a_histogram() -> None:
    histogram = {latency_bucket(10): 98, latency_bucket(1000): 2}
    assert quantile_ms(histogram, 0.5) == bucket_upper_ms(latency_bucket(10))
    assert quantile_ms(histogram, 0.99) == bucket_upper_ms(latency_bucket(1000))
    assert quantile_ms({}, 0.5) is None


async def test_a_pass_folds_new_events_once(redis_client: aioredis.Redis, redis_url: str) -> None:
    async with RedisClient.from_url(redis_url) as fleet_redis:
        # given events of 3 jobs (one failed, one retried), a drift, and an entry with no job
        keys = Keys("af:")
        events = [
            {"job": _jid(T0_MS, 1), "session": "e/s1", "state": "queued"},
            {"job": _jid(T0_MS, 2), "session": "e/s2", "state": "queued"},
            {"job": _jid(T0_MS, 1), "session": "e/s1", "state": "running"},
            {"job": _jid(T0_MS, 1), "session": "e/s1", "state": "succeeded"},
            {"job": _jid(T0_MS, 2), "session": "e/s2", "state": "queued"},
            {"job": _jid(T0_MS, 2), "session": "e/s2", "state": "failed"},
            {"session": "e/s2", "drift": "memory_lost", "detail": "pod gone"},
            {"state": "queued"},
        ]
        at_ms = [T0_MS + d for d in (0, 1, 2, 10, 1500, 2000, 2500, 2600)]
        for fields, ms in zip(events, at_ms, strict=True):
            await redis_client.xadd(keys.events, fields, id=f"{ms}-0")  # type: ignore[arg-type]
        stats_pass, report = StatsPass(_config(), fleet_redis, keys), PassReport("fleet_stats")

        # when the pass runs twice (the second finds nothing new)
        await stats_pass.run(report)
        await stats_pass.run(report)

        # then each bucket counts once, the latencies land in theirs, the indexes hold the jobs
        assert report.examined == len(events)
        bucket = await redis_client.hgetall(keys.stats_bucket(T0_MS // 1000))
        assert bucket == {b"queued": b"2", b"succeeded": b"1", b"failed": b"1", b"drift": b"1",
                          f"l{latency_bucket(10)}".encode(): b"1", f"l{latency_bucket(2000)}".encode(): b"1"}
        assert 0 < await redis_client.ttl(keys.stats_bucket(T0_MS // 1000))
        stats = FleetStats(fleet_redis, keys)
        assert await stats.session_jobs("e/s2", 10) == [_jid(T0_MS, 2)]
        assert await stats.recent_jobs(None, 10) == [_jid(T0_MS, 2), _jid(T0_MS, 1)]
        assert [d["drift"] for d in await stats.session_drifts("e/s2", 10)] == ["memory_lost"]
        points = await stats.series(now_s=T0_MS // 1000 + 10, window_s=10)
        assert points[0].calls_per_s == 0.2 and points[0].failed_per_s == 0.1 and points[0].drifts == 1


async def test_indexes_are_capped(redis_client: aioredis.Redis, redis_url: str) -> None:
    async with RedisClient.from_url(redis_url) as fleet_redis:
        keys = Keys("af:")
        for n in range(SESSION_JOBS_MAX + 5):
            event = {"job": _jid(T0_MS + n, n), "session": "e/s", "state": "queued"}
            await redis_client.xadd(keys.events, event, id=f"{T0_MS + n}-0")  # type: ignore[arg-type]
        await StatsPass(_config(), fleet_redis, keys).run(PassReport("fleet_stats"))
        assert await redis_client.zcard(keys.session_jobs("e/s")) == SESSION_JOBS_MAX
        newest = await FleetStats(fleet_redis, keys).session_jobs("e/s", 1)
        assert newest == [_jid(T0_MS + SESSION_JOBS_MAX + 4, SESSION_JOBS_MAX + 4)]


async def test_sessions_are_counted_by_state(redis_client: aioredis.Redis, redis_url: str) -> None:
    async with RedisClient.from_url(redis_url) as fleet_redis:
        keys = Keys("af:")
        for sid, state in [("a", "running"), ("b", "suspended"), ("c", "running"), ("d", None)]:
            await redis_client.zadd(keys.session_index("e"), {sid: 0})
            if state:
                await redis_client.hset(keys.session(f"e/{sid}"), "state", state)  # type: ignore[misc]
        await StatsPass(_config(), fleet_redis, keys).run(PassReport("fleet_stats"))
        counts = await FleetStats(fleet_redis, keys).sessions_by_state()
        assert counts == {"running": 2, "suspended": 1, "new": 1}
