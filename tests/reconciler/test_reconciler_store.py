"""The reconciler's Lua scripts on the real Redis: survey, fenced session repair, GC, index."""

from __future__ import annotations

import redis.asyncio as aioredis

from common.queue import JobKind, NewJob, Queue
from reconciler.store import ReconcilerStore
from tests.reconciler.conftest import ENV, set_session


async def _leader(store: ReconcilerStore) -> str:
    acquired, value = await store.leader_acquire("me", 10_000)
    assert acquired
    return value


async def test_survey_pages_through_every_session(queue: Queue, store: ReconcilerStore) -> None:
    # given 7 sessions, one running with a stamp, one with a queued job
    for i in range(6):
        await set_session(queue, f"s{i}", state="suspended")
    await set_session(queue, "run", state="running", last_activity="123.5")
    await queue.enqueue(NewJob(ENV, "s0", JobKind.TOOL, {}, "tester"))
    # when surveyed 3 at a time
    rows = [r for page in [p async for p in store.sessions(ENV, page=3)] for r in page]
    # then every session is seen once with what the passes need
    by_sid = {r.session_id: r for r in rows}
    assert sorted(by_sid) == ["run", "s0", "s1", "s2", "s3", "s4", "s5"]
    assert by_sid["run"].state == "running" and by_sid["run"].last_activity == 123.5
    assert by_sid["s0"].queued == 1 and by_sid["s1"].queued == 0
    assert all(r.exists and not r.leased and r.epoch for r in rows)


async def test_repair_session_is_fenced(queue: Queue, store: ReconcilerStore,
                                        redis_client: aioredis.Redis) -> None:
    await set_session(queue, "a", state="running")
    leader = await _leader(store)
    (row,) = [r for page in [p async for p in store.sessions(ENV)] for r in page]
    # a stale leader value writes nothing
    assert await store.repair_session("other:0", row, "memory_lost", "x", {"state": "lost"}) == "notleader"
    # a worker holding the lease: nothing written
    await redis_client.set(queue.keys.lease(row.session), "w:99", px=5000)
    assert await store.repair_session(leader, row, "memory_lost", "x", {"state": "lost"}) == "owned"
    await redis_client.delete(queue.keys.lease(row.session))
    # the epoch moved since the survey (a worker took a turn): nothing written
    await redis_client.hincrby(queue.keys.session(row.session), "epoch", 1)
    assert await store.repair_session(leader, row, "memory_lost", "x", {"state": "lost"}) == "changed"
    assert (await queue.get_session(ENV, "a") or {})["state"] == "running"
    # a fresh survey: written and recorded on the session and in `events`
    (row,) = [r for page in [p async for p in store.sessions(ENV)] for r in page]
    assert await store.repair_session(leader, row, "memory_lost", "gone", {"state": "lost"}) == "ok"
    sess = await queue.get_session(ENV, "a") or {}
    assert sess["state"] == "lost" and sess["drift"] == "memory_lost" and sess["drifts"] == "1"
    last = (await redis_client.xrevrange(queue.keys.events, count=1))[0][1]
    assert last[b"drift"] == b"memory_lost" and last[b"session"] == f"{ENV}/a".encode()


async def test_gc_keys_gives_ttls_and_drops_stray_secrets(queue: Queue, store: ReconcilerStore,
                                                          redis_client: aioredis.Redis) -> None:
    k = queue.keys
    await redis_client.hset(k.job("done"), mapping={"st": "succeeded", "s": f"{ENV}/x"})
    await redis_client.hset(k.job("live"), mapping={"st": "queued", "s": f"{ENV}/x"})
    await redis_client.set(k.secrets("gone"), "{}")
    await redis_client.set(k.secrets("live"), "{}")
    await redis_client.xadd(k.output("done"), {"event": "end"})
    await redis_client.set(k.idempotency("p", "key"), "j f")
    batch = [("j", k.job("done"), k.job("done")), ("j", k.job("live"), k.job("live")),
             ("s", k.secrets("gone"), k.job("gone")), ("s", k.secrets("live"), k.job("live")),
             ("o", k.output("done"), k.job("done")),
             ("i", k.idempotency("p", "key"), k.idempotency("p", "key"))]
    fixes = await store.gc_keys(batch, 60_000, 60_000, 60_000)
    assert (fixes.job_ttls, fixes.output_ttls, fixes.secrets_deleted, fixes.idempotency_ttls) == (1, 1, 1, 1)
    assert await redis_client.pttl(k.job("live")) == -1 and await redis_client.exists(k.secrets("live"))
    assert not await redis_client.exists(k.secrets("gone"))


async def test_prune_index_drops_members_without_a_session(queue: Queue, store: ReconcilerStore,
                                                           redis_client: aioredis.Redis) -> None:
    await set_session(queue, "kept", state="suspended")
    await redis_client.zadd(queue.keys.session_index(ENV), {"ghost": 0})
    assert await store.prune_index(ENV, ["ghost", "kept"]) == 1
    assert [r.session_id for p in [p async for p in store.sessions(ENV)] for r in p] == ["kept"]


async def test_leader_lease_scripts(store: ReconcilerStore) -> None:
    ok, first = await store.leader_acquire("a", 10_000)
    assert ok and first.startswith("a:")
    assert await store.leader_acquire("b", 10_000) == (False, first)
    assert await store.leader_renew(first, 10_000)
    assert not await store.leader_release("b:1")
    assert await store.leader_release(first)
    ok, second = await store.leader_acquire("b", 10_000)
    assert ok and int(second.split(":")[1]) > int(first.split(":")[1])
    assert not await store.leader_renew(first, 10_000)
