"""The capacity indexes and the turn script (common.capacity, capacity_turn.lua) on the real Redis:
the fair wait queue, which running session a waiter parks, and the view GET /v1/capacity answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from common.capacity import ADMIT_WINDOW, Capacity, SuspendedBy
from common.config import Config, parse_config
from common.queue.keys import Keys
from common.redis.client import RedisClient
from workers.actors import ActorKeeper, _Waiter

ENV = "cap-env"
BG_ENV = "bg-env"  # suspend_with_background: its background processes do not stop a park


@pytest.fixture
def config() -> Config:
    return parse_config({
        "environments": [{"name": ENV}, {"name": BG_ENV, "suspend_with_background": True}],
        "workers": {"min_idle_s": 1.0},
    })


@pytest.fixture
async def capacity(redis_url: str, config: Config) -> AsyncIterator[Capacity]:
    async with RedisClient.from_url(redis_url) as client:
        yield Capacity(client, config)


async def _running(redis: aioredis.Redis, session: str, idle_s: float, background: bool = False) -> None:
    """A session the fleet resumed, last active `idle_s` ago."""
    keys = Keys("af:")
    await redis.hset(keys.session(session), mapping={  # type: ignore[misc]
        "state": "running", "last_activity": str(time.time() - idle_s),
        "background_processes": json.dumps([{"pid": 1}] if background else [])})
    await redis.zadd(keys.running, {session: 1})


async def _lease(redis: aioredis.Redis, session: str) -> None:
    await redis.set(Keys("af:").lease(session), "w:1", px=60_000)


async def test_waiters_queue_first_come_first_served(redis_client: aioredis.Redis,
                                                      capacity: Capacity) -> None:
    # given three resumes waiting in turn (each holds its session's lease, as a worker's turn does)
    for s in ("e/a", "e/b", "e/c"):
        await _lease(redis_client, s)
    ranks = [(await capacity.turn(s)).rank for s in ("e/a", "e/b", "e/c")]
    # then their places are the order they came in, and asking again keeps a place
    assert ranks == [0, 1, 2]
    assert (await capacity.turn("e/b")).rank == 1
    assert await capacity.position("e/c") is not None and (await capacity.position("e/c") or (0, 0))[0] == 2
    # when the first leaves (it got a worker), then everyone moves up
    await capacity.resumed("e/a")
    assert (await capacity.turn("e/c")).rank == 1
    assert await capacity.position("e/a") is None


async def test_a_place_is_the_waiting_jobs_creation_time(redis_client: aioredis.Redis,
                                                          capacity: Capacity) -> None:
    # given a waiter whose job was created at t=2000 ms
    for s in ("e/later", "e/earlier"):
        await _lease(redis_client, s)
    assert (await capacity.turn("e/later", since_ms=2000)).rank == 0
    # when a job created before it (at t=1000 ms) waits too (say, re-run after its worker died),
    # then that one is first in line
    assert (await capacity.turn("e/earlier", since_ms=1000)).rank == 0
    assert (await capacity.turn("e/later", since_ms=2000)).rank == 1


async def test_a_waiter_without_a_lease_does_not_hold_up_the_line(redis_client: aioredis.Redis,
                                                                   capacity: Capacity) -> None:
    # given a waiter at the front whose worker died (no lease any more)
    await _lease(redis_client, "e/dead")
    assert (await capacity.turn("e/dead")).rank == 0
    await redis_client.delete(Keys("af:").lease("e/dead"))
    # when another resume takes its turn, then it is first in line and admitted
    await _lease(redis_client, "e/live")
    turn = await capacity.turn("e/live")
    assert turn.rank == 0 and turn.admitted
    assert await capacity.position("e/dead") is None


async def test_the_session_idle_longest_is_parked(redis_client: aioredis.Redis, capacity: Capacity) -> None:
    # given running sessions: idle long, idle longer but busy (leased), with a queued job, with a
    # background process, active just now, and idle long in an environment allowing background ones
    await _running(redis_client, f"{ENV}/idle", idle_s=30)
    await _running(redis_client, f"{ENV}/leased", idle_s=300)
    await _lease(redis_client, f"{ENV}/leased")
    await _running(redis_client, f"{ENV}/queued", idle_s=300)
    await redis_client.rpush(Keys("af:").fifo(f"{ENV}/queued"), "job-1")
    await _running(redis_client, f"{ENV}/background", idle_s=300, background=True)
    await _running(redis_client, f"{ENV}/active", idle_s=0.1)
    await _running(redis_client, f"{BG_ENV}/background-ok", idle_s=60, background=True)
    # when resumes wait for a worker, then each gets one park, idle longest first among the
    # eligible, and none is picked twice
    picks = []
    for waiter in ("w/1", "w/2", "w/3"):
        await _lease(redis_client, waiter)
        picks.append((await capacity.turn(waiter)).park)
    assert picks == [f"{BG_ENV}/background-ok", f"{ENV}/idle", None]
    # and asking again while its park is in flight asks for no other
    assert (await capacity.turn("w/1")).park is None
    # when a park ends, then it is no longer in flight and it counts as parked
    await capacity.park_finished(f"{ENV}/idle")
    await capacity.suspended(f"{ENV}/idle", SuspendedBy.PRESSURE, "job-park")
    view = await capacity.view()
    assert view["parks"] == {"in_flight": 1, "per_minute": 1}
    assert view["sessions"]["parked"] == 1 and view["sessions"]["waiting"] == 3


async def test_a_waiter_is_told_while_its_own_park_is_in_flight(redis_client: aioredis.Redis,
                                                                 capacity: Capacity) -> None:
    # given two idle sessions and a waiter at the back of the line that was given one to park
    await _running(redis_client, f"{ENV}/idle-1", idle_s=60)
    await _running(redis_client, f"{ENV}/idle-2", idle_s=30)
    for waiter in ("w/front", "w/back"):
        await _lease(redis_client, waiter)
    # (places a millisecond apart at least: at the same one, the line orders them by name)
    joined_ms = int(time.time() * 1000) - 1000
    assert (await capacity.turn("w/front", since_ms=joined_ms)).park == f"{ENV}/idle-1"
    assert (await capacity.turn("w/back", since_ms=joined_ms + 1)).park == f"{ENV}/idle-2"
    # when the back one asks again naming its park, then it is in flight and no other is given,
    # though the front one's park ended (fewer parks in flight than waiters up to it)
    await capacity.park_finished(f"{ENV}/idle-1")
    await _running(redis_client, f"{ENV}/idle-3", idle_s=90)
    turn = await capacity.turn("w/back", parking=f"{ENV}/idle-2")
    assert turn.park_in_flight and turn.park is None and turn.rank == 1
    # when its park ends (here or in another worker process), then the turn says so, and gives
    # no other park before the waiter has asked Substrate for the worker that park freed
    await capacity.park_finished(f"{ENV}/idle-2")
    turn = await capacity.turn("w/back", parking=f"{ENV}/idle-2")
    assert not turn.park_in_flight and turn.park is None
    # and asking again without it (Substrate refused) gives the next park
    assert (await capacity.turn("w/back")).park == f"{ENV}/idle-3"


async def test_a_session_no_longer_running_is_dropped_from_the_candidates(redis_client: aioredis.Redis,
                                                                          capacity: Capacity) -> None:
    await _running(redis_client, f"{ENV}/gone", idle_s=30)
    await redis_client.hset(Keys("af:").session(f"{ENV}/gone"), "state", "lost")  # type: ignore[misc]
    await _lease(redis_client, "w/1")
    assert (await capacity.turn("w/1")).park is None
    assert await redis_client.zcard(Keys("af:").running) == 0


async def test_view_before_any_worker_count(capacity: Capacity) -> None:
    view = await capacity.view()
    assert view["workers"] == {"total": None, "busy": None, "free": None, "observed_at_ms": None}
    assert view["wait_queue"] == {"length": 0, "oldest_wait_s": 0.0, "admit_window": ADMIT_WINDOW}
    await capacity.publish_workers(8, 5)
    assert (await capacity.view())["workers"]["free"] == 3


@asynccontextmanager
async def _two_processes(redis_url: str, config: Config) -> AsyncIterator[tuple[ActorKeeper, ActorKeeper]]:
    """Two worker processes' keepers on one Redis, each listening on the told channel."""
    async with RedisClient.from_url(redis_url) as a, RedisClient.from_url(redis_url) as b:
        keepers = tuple(ActorKeeper(config, substrate=None, router=None,  # type: ignore[arg-type]
                                    capacity=Capacity(r, config)) for r in (a, b))
        listeners = [asyncio.create_task(k.listen()) for k in keepers]
        try:
            for k in keepers:
                await asyncio.wait_for(k.listening.wait(), 5)
            yield keepers[0], keepers[1]
        finally:
            for task in listeners:
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)


async def _waiting(redis: aioredis.Redis, keeper: ActorKeeper, session: str, since_ms: int) -> _Waiter:
    """A resume of `keeper`'s process waiting in line since `since_ms` (its lease held)."""
    await _lease(redis, session)
    await keeper.capacity.turn(session, since_ms=since_ms, parking="e/none")
    waiter = keeper._waiters[session] = _Waiter(place=(since_ms, session))
    return waiter


async def _told(waiters: dict[str, _Waiter]) -> list[str]:
    """The waiters told so far (a moment given to the told channel)."""
    await asyncio.sleep(0.05)
    return [s for s, w in waiters.items() if w.woken.is_set()]


async def test_a_freed_worker_goes_to_the_first_waiter_in_line_in_whichever_process_it_waits(
        redis_url: str, redis_client: aioredis.Redis, config: Config) -> None:
    async with _two_processes(redis_url, config) as (here, there):
        # given waiters in two worker processes, in line in another order than by process
        waiters = {"e/front": await _waiting(redis_client, there, "e/front", 1000),
                   "e/middle": await _waiting(redis_client, here, "e/middle", 2000),
                   "e/back": await _waiting(redis_client, there, "e/back", 3000)}
        # when parks here end one after another, then each tells the first waiter not told yet,
        # there through the told channel
        told = []
        for _ in waiters:
            await here.park_ended("e/parked", freed=True)
            told += [s for s in await _told(waiters) if s not in told]
        assert told == ["e/front", "e/middle", "e/back"]
        told_marks = await redis_client.zrange(Keys("af:").capacity_told, 0, -1)
        assert sorted(told_marks) == sorted(s.encode() for s in waiters)
        # and one more, with every waiter told, tells nobody
        assert await here._tell() is None
        # when a told waiter's resume is refused (another took the worker), then it is told
        # again first: it is still first in line
        waiters["e/front"].woken.clear()
        await there.capacity.refused("e/front")
        assert (await here._tell() or ("",))[0] == "e/front" and "e/front" in await _told(waiters)
        # when a told waiter's worker process died and its job's re-run joins the line again,
        # then it keeps its place and is told again first
        assert (await there.capacity.turn("e/front", since_ms=1000, joining=True)).rank == 0
        assert (await here._tell() or ("",))[0] == "e/front"
        # when a told waiter resumed, or left the line, then it is told no more
        await there.capacity.resumed("e/front")
        await here.capacity.leave("e/middle")
        assert await redis_client.zrange(Keys("af:").capacity_told, 0, -1) == [b"e/back"]


async def test_a_skipped_park_tells_nobody_and_a_waiter_without_its_lease_is_passed_over(
        redis_url: str, redis_client: aioredis.Redis, config: Config) -> None:
    async with _two_processes(redis_url, config) as (here, there):
        waiters = {"e/dead": await _waiting(redis_client, there, "e/dead", 1000),
                   "e/next": await _waiting(redis_client, there, "e/next", 2000)}
        # when a park is skipped (a call of that session came first), then nobody is told
        await here.park_ended("e/busy", freed=False)
        assert await _told(waiters) == []
        # when the first waiter's lease lapsed (its worker died), then a freed worker goes past it
        await redis_client.delete(Keys("af:").lease("e/dead"))
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == ["e/next"]


async def test_a_session_id_of_every_allowed_shape_is_told_across_processes(
        redis_url: str, redis_client: aioredis.Redis, config: Config) -> None:
    # Session ids are the tenant's (the API's pattern: 128 characters at most, with . _ : -):
    # they pass through the tell script's lease key and the told channel as they are.
    odd = f"{ENV}/a:b.c_-{'9' * 120}"
    prefix = f"{ENV}/a:b.c_-{'9' * 119}"  # a prefix of it, in line first, without its lease
    async with _two_processes(redis_url, config) as (here, there):
        waiters = {odd: await _waiting(redis_client, there, odd, 2000)}
        await _waiting(redis_client, here, prefix, 1000)
        await redis_client.delete(Keys("af:").lease(prefix))
        # when a worker is freed here, then the waiter there with that id is told, and no other
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == [odd]
        assert not here._waiters[prefix].woken.is_set()
        assert await redis_client.zrange(Keys("af:").capacity_told, 0, -1) == [odd.encode()]


async def test_with_the_embedded_substrate_a_park_tells_the_first_waiter_before_its_suspend(
        redis_url: str, redis_client: aioredis.Redis, config: Config) -> None:
    # The local Substrate frees a suspending actor's place once its sandbox is stopped, so a
    # pressure park tells the first waiter as it starts the suspend; that park's end then tells
    # nobody else, unless the waiter it told is gone without its worker.
    async def begin(here: ActorKeeper, there: ActorKeeper) -> dict[str, _Waiter]:
        await redis_client.delete(Keys("af:").capacity_wait, Keys("af:").capacity_told)
        waiters = {"e/front": await _waiting(redis_client, there, "e/front", 1000),
                   "e/next": await _waiting(redis_client, here, "e/next", 2000)}
        await here._hand_over("e/parked")
        assert await _told(waiters) == ["e/front"]
        return waiters

    async with _two_processes(redis_url, config) as (here, there):
        # given two waiters, when a park starts its suspend, then the first is told at once, and
        # when the park ends while that waiter still asks, then nobody else is told for it
        waiters = await begin(here, there)
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == ["e/front"]

        # when its resume came too early and was refused, then the park's end tells it again
        waiters = await begin(here, there)
        waiters["e/front"].woken.clear()
        await there.capacity.refused("e/front")
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == ["e/front"]

        # when it resumed and left, then the park's worker was its: nobody else is told
        waiters = await begin(here, there)
        await there.capacity.resumed("e/front")
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == ["e/front"]

        # when it gave up without resuming, then the park's worker goes to the next waiter
        waiters = await begin(here, there)
        await there.capacity.leave("e/front")
        await here.park_ended("e/parked", freed=True)
        assert await _told(waiters) == ["e/front", "e/next"]

    # with a real Substrate (it refuses a resume until the suspend is done), nobody is told early
    cluster = parse_config({"environments": [{"name": ENV}], "ate": {"ateapi": "api:443"}})
    async with _two_processes(redis_url, cluster) as (here, there):
        await redis_client.delete(Keys("af:").capacity_wait, Keys("af:").capacity_told)
        early = {"e/front": await _waiting(redis_client, there, "e/front", 1000)}
        await here._hand_over("e/parked")
        assert await _told(early) == []
        await here.park_ended("e/parked", freed=True)
        assert await _told(early) == ["e/front"]


async def test_a_job_ending_here_makes_the_front_waiter_without_a_park_look_once_idle_enough() -> None:
    # (pure logic: which waiter of a worker process a session that may be a candidate tells)
    config = parse_config({"environments": [{"name": ENV}], "workers": {"min_idle_s": 0.05}})
    keeper = ActorKeeper(config, substrate=None, router=None, capacity=None)  # type: ignore[arg-type]
    # given no waiter here, then a job's end schedules nothing
    keeper.session_idle("e/ended")
    # given the first waiter in line with its park in flight, one told a worker is its own, and two more
    waiters = {s: _Waiter(place=(ms, s)) for s, ms in
               (("e/parking", 1000), ("e/woken", 1500), ("e/next", 2000), ("e/last", 3000))}
    waiters["e/parking"].victim = "e/victim"
    waiters["e/woken"].woken.set()
    keeper._waiters.update(waiters)
    # when a job that parks its session itself ends here, then nobody is nudged for it
    keeper._parking_at_end.add("e/self-parked")
    keeper.session_idle("e/self-parked")
    await asyncio.sleep(0.1)
    assert not any(w.nudged.is_set() for w in waiters.values()) and not keeper._parking_at_end
    # when a job ends here, then nobody looks before min_idle_s (the session is no candidate yet)
    keeper.session_idle("e/ended")
    await asyncio.sleep(0.03)
    assert not any(w.nudged.is_set() for w in waiters.values())
    # and once it has passed, the front waiter that can ask for a park looks, and only that one
    await asyncio.sleep(0.05)
    assert [s for s, w in waiters.items() if w.nudged.is_set()] == ["e/next"]

    # when the park it asked for ends (say, skipped), then that waiter may ask for another at once
    await keeper.park_ended("e/victim", freed=False)
    assert waiters["e/parking"].victim is None and waiters["e/parking"].nudged.is_set()
