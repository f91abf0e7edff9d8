"""The passes' decisions on the real Redis, without Substrate: the idle pass and the drift table."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from common.actor_names import actor_name
from common.config import Config
from common.queue import JobKind, NewJob, Queue
from common.substrate import Actor, ActorStatus
from reconciler.drift import Drift, is_ours, naming_prefix, orphan_drift, session_drift
from reconciler.idle import IdlePass
from reconciler.report import PassReport
from reconciler.store import ReconcilerStore, SessionRow
from tests.reconciler.conftest import ENV, set_session


async def _fifo_kinds(queue: Queue, sid: str) -> list[str]:
    ids = await queue.redis.lrange(queue.keys.fifo(f"{ENV}/{sid}"), 0, -1)
    jobs = [await queue.get_job(i.decode()) for i in ids]
    return [str(j.kind) for j in jobs if j is not None]


async def test_idle_pass_asks_idle_sessions_once(config: Config, queue: Queue, store: ReconcilerStore,
                                                 redis_client: aioredis.Redis) -> None:
    # given an idle running session, a recent one, a suspended one, one with a queued job, an owned one
    old = str(time.time() - 5)
    await set_session(queue, "idle", state="running", last_activity=old)
    await set_session(queue, "recent", state="running", last_activity=str(time.time()))
    await set_session(queue, "parked", state="suspended", last_activity=old)
    await set_session(queue, "queued", state="running", last_activity=old)
    await set_session(queue, "owned", state="running", last_activity=old)
    await queue.enqueue(NewJob(ENV, "queued", JobKind.TOOL, {}, "tester"))
    await redis_client.set(queue.keys.lease(f"{ENV}/owned"), "w:1", px=10_000)
    idle = IdlePass(config, queue, store)
    # when the pass runs twice
    first, second = PassReport("idle"), PassReport("idle")
    await idle.run(first)
    await idle.run(second)
    # then only the idle session got one suspend_if_idle job, through its FIFO, once
    assert first.repairs["idle_suspend_requested"] == 1 and second.repairs["idle_suspend_requested"] == 0
    assert await _fifo_kinds(queue, "idle") == ["suspend_if_idle"]
    assert await _fifo_kinds(queue, "queued") == ["tool"]
    for sid in ("recent", "parked", "owned"):
        assert await _fifo_kinds(queue, sid) == []
    assert first.examined == 5


async def test_idle_pass_asks_again_after_new_activity(config: Config, queue: Queue, store: ReconcilerStore,
                                                      redis_client: aioredis.Redis) -> None:
    await set_session(queue, "bg", state="running", last_activity=str(time.time() - 5))
    idle = IdlePass(config, queue, store)
    await idle.run(PassReport("idle"))
    await idle.run(PassReport("idle"))  # while the job is queued
    # the worker declined (a background process runs): the job is gone, the stamp unchanged
    await redis_client.delete(queue.keys.fifo(f"{ENV}/bg"))
    report = PassReport("idle")
    await idle.run(report)
    assert report.repairs["idle_suspend_requested"] == 0
    # new activity, idle again later: asked again
    await set_session(queue, "bg", state="running", last_activity=str(time.time() - 2))
    report = PassReport("idle")
    await idle.run(report)
    assert report.repairs["idle_suspend_requested"] == 1


def _row(state: str, leased: bool = False, queued: int = 0, kept: bool = False) -> SessionRow:
    return SessionRow(ENV, "s", state, None, "1", kept, queued, leased, True)


def _actor(status: ActorStatus) -> Actor:
    return Actor("default", "s-x", "s-x", 1, "default", "t", status)


def test_drift_table() -> None:
    run, sus = _actor(ActorStatus.RUNNING), _actor(ActorStatus.SUSPENDED)
    resuming = _actor(ActorStatus.RESUMING)
    assert session_drift(_row("running"), sus, False) is Drift.MEMORY_LOST
    assert session_drift(_row("running"), None, False) is Drift.ACTOR_MISSING
    assert session_drift(_row("running", leased=True), sus, False) is None
    assert session_drift(_row("suspended"), run, False) is Drift.ADOPTED
    assert session_drift(_row("running"), run, False) is None
    assert session_drift(_row("suspending"), sus, False) is Drift.SETTLED
    assert session_drift(_row("suspending", queued=1), sus, False) is None
    assert session_drift(_row("suspended"), resuming, False) is None
    assert session_drift(_row("suspended"), resuming, True) is Drift.STUCK_RESUMING
    assert session_drift(_row("destroyed"), sus, False) is Drift.DESTROY_FINISHED
    assert session_drift(_row("destroyed", kept=True), sus, False) is None
    assert session_drift(_row("destroyed"), None, False) is None
    assert session_drift(_row("new"), None, False) is None
    assert orphan_drift(run, False, 0, 0) is Drift.ORPHAN_SUSPENDED
    assert orphan_drift(sus, False, 5, 0) is None
    assert orphan_drift(sus, False, 5, 2) is Drift.ORPHAN_DELETED


def test_our_naming() -> None:
    prefixes = (naming_prefix(ENV),)
    assert is_ours(actor_name(ENV, "abc"), prefixes)
    assert is_ours(actor_name(ENV, "x" * 80), prefixes)
    assert not is_ours(actor_name("other-env", "abc"), prefixes)
    assert not is_ours("foreign-actor", prefixes)


async def test_gc_pass_cleans_what_ttls_cannot(config: Config, queue: Queue, store: ReconcilerStore,
                                               redis_client: aioredis.Redis) -> None:
    from reconciler.gc import GcPass

    k = queue.keys
    # given an old event, a stale index member, a finished job without TTL, stray secrets
    await redis_client.xadd(k.events, {"job": "old", "state": "succeeded"}, id="1000-0")
    await set_session(queue, "real", state="suspended")
    await redis_client.zadd(k.session_index(ENV), {"ghost": 0})
    await redis_client.hset(k.job("lost-ttl"), mapping={"st": "failed", "s": f"{ENV}/real"})
    await redis_client.set(k.secrets("never-ran"), "{}")
    report = PassReport("gc")
    await GcPass(config, queue, store).run(report)
    assert report.repairs["stale_index_entries"] == 1
    assert report.repairs["job_ttl_set"] >= 1 and report.repairs["secrets_deleted"] == 1
    assert await redis_client.pttl(k.job("lost-ttl")) > 0
    assert not await redis_client.xrange(k.events, "1000-0", "1000-0")
    assert [r.session_id for p in [p async for p in store.sessions(ENV)] for r in p] == ["real"]


async def test_each_pass_is_measured(config: Config, queue: Queue, store: ReconcilerStore) -> None:
    from prometheus_client import REGISTRY

    from reconciler.report import measured

    def count(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    await set_session(queue, "idle", state="running", last_activity=str(time.time() - 5))
    passes_before = count("atefleet_reconciler_pass_seconds_count", {"pass_name": "idle"})
    repairs_before = count("atefleet_reconciler_repairs_total", {"kind": "idle_suspend_requested"})
    report = await measured("idle", IdlePass(config, queue, store).run)
    assert report.examined == 1 and report.duration_s > 0
    assert count("atefleet_reconciler_pass_seconds_count", {"pass_name": "idle"}) == passes_before + 1
    repairs = count("atefleet_reconciler_repairs_total", {"kind": "idle_suspend_requested"})
    assert repairs == repairs_before + 1
    assert count("atefleet_sessions", {"state": "running"}) == 1
