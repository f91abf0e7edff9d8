"""Two cells: the queue on two Redis servers at once, sessions split between them (docs/scaling.md).

A cell is a whole queue on one Redis, with its own `ready`, `idle`, `events`, `work`, `active`...
Each session goes to the cell its actor name's hash picks; worker processes each serve both cells
(one Consumer per cell); the reconciler's repairs run per cell; workers are SIGKILLed at random
while the queues drain, and replaced. In each cell nothing is lost, order is kept and interrupted
jobs resume at the head, and neither Redis holds anything of a session or job of the other cell.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from queue_testkit import WorkerFleet, WorkerProc, job, run_repairs
from test_queue_chaos import kill_as_jobs_run, nothing_lost_order_kept, wait_drained

from common.actor_names import HASH_HEX, actor_name
from common.config import Config
from common.queue import Queue, session_name
from common.redis.client import RedisClient
from tests.redis_servers import start_redis

CELLS = 2
ENV = "env"
SESSIONS = 160
JOBS_PER_SESSION = 40
PROCESSES = 3
CONCURRENCY = 16
LEASE_TTL_S = 1.5
RECONCILER_PERIOD_S = 0.25

#: Session → job ids in FIFO order, for the sessions of one cell.
Order = dict[str, list[str]]

#: Where a key names a session (its hash tag, or a handler log) or a job.
SESSION_IN_KEY = re.compile(r"\{(?P<tagged>[^}]*)\}|^t:log:(?P<logged>.*)$")
JOB_KEY = re.compile(r"^af:(?:job|out|sec):(?P<jid>.*)$")


def cell_of(environment: str, session_id: str) -> int:
    """The routing rule of docs/scaling.md: the hash ending the actor name, modulo the cells."""
    return int(actor_name(environment, session_id)[-HASH_HEX:], 16) % CELLS


@dataclass
class Cell:
    url: str
    redis: aioredis.Redis
    queue: Queue


@pytest.fixture
def second_redis_url(tmp_path: Path) -> Iterator[str]:
    """Another real Redis of the kind the run tests against: cell 1 (cell 0 is the shared one)."""
    server = start_redis(tmp_path / "cell1")
    yield server.url
    server.stop()


@pytest.fixture
async def cells(redis_url: str, second_redis_url: str, queue_config: Config) -> AsyncIterator[list[Cell]]:
    made = []
    for url in (redis_url, second_redis_url):
        client = aioredis.Redis.from_url(url)
        made.append(Cell(url, client, Queue(RedisClient.from_url(url), queue_config)))
    yield made
    for cell in made:
        await cell.queue.redis.aclose()
        await cell.redis.aclose()


async def enqueue_split(cells: list[Cell], sessions: int, jobs_per_session: int) -> list[Order]:
    """Jobs round-robin over sessions (a batch per cell), each session's in its own cell."""
    orders: list[Order] = [{} for _ in cells]
    for n in range(sessions):
        orders[cell_of(ENV, f"s{n}")][f"s{n}"] = []
    for i in range(jobs_per_session):
        for cell, order in zip(cells, orders, strict=True):
            results = await cell.queue.enqueue_batch([job(s, i, ENV) for s in order])
            for s, res in zip(order, results, strict=True):
                order[s].append(res.job_id)
    return orders


async def jobs_run(cell: Cell, worker: WorkerProc) -> int:
    """Jobs the worker process ran in this cell (its consumer there mirrors its counters)."""
    return int(await cell.redis.hget(f"t:stats:{worker.worker_id}", "jobs") or 0)


async def foreign_names(redis: aioredis.Redis, order: Order) -> list[str]:
    """Keys, `events` entries and session index members in this cell's Redis that name a session
    or a job not of this cell (`order`)."""
    sessions = {session_name(ENV, s) for s in order}
    jobs = {jid for ids in order.values() for jid in ids}
    found: list[str] = []
    async for raw in redis.scan_iter(count=1000):
        key = raw.decode()
        named = SESSION_IN_KEY.search(key)
        if named and (named["tagged"] or named["logged"]) not in sessions:
            found.append(key)
        jk = JOB_KEY.match(key)
        if jk and jk["jid"] not in jobs:
            found.append(key)
    for _id, fields in await redis.xrange("af:events"):
        if fields[b"session"].decode() not in sessions or fields[b"job"].decode() not in jobs:
            found.append(f"events: {fields}")
    indexed = await redis.zrange(f"af:sessions:{ENV}", 0, -1)
    found += [f"index: {m.decode()}" for m in indexed if m.decode() not in order]
    return found


@pytest.mark.slow
async def test_two_cells_sigkill_workers_nothing_lost_order_kept_cells_apart(cells: list[Cell]) -> None:
    # given sessions split between two Redis servers by their cell, jobs queued in each
    orders = await enqueue_split(cells, SESSIONS, JOBS_PER_SESSION)
    assert all(len(order) >= SESSIONS // 4 for order in orders), [len(o) for o in orders]
    fleet = WorkerFleet(cells[0].url, other_cells=[c.url for c in cells[1:]], concurrency=CONCURRENCY,
                        lease_ttl_s=LEASE_TTL_S, max_job_ms=2.0, name="cells")
    stop_repairs = asyncio.Event()
    repairs = [asyncio.create_task(run_repairs(c.queue, RECONCILER_PERIOD_S, stop_repairs)) for c in cells]
    kills: dict[str, float] = {}
    rng = random.Random(5)
    total = sum(len(ids) for order in orders for ids in order.values())
    try:
        alive = [fleet.start() for _ in range(PROCESSES)]
        # when worker processes, each serving both cells, are SIGKILLed as the jobs run pass each
        # tenth of them
        await kill_as_jobs_run(fleet, alive, [c.redis for c in cells], total, 10, rng, kills)
        for cell in cells:
            await wait_drained(cell.redis, 120)
    finally:
        stop_repairs.set()
        await asyncio.gather(*repairs)
        fleet.stop_all()
    assert len(kills) >= 3, "the run was too short to kill workers mid-way"
    # then in each cell every job ran once to success, in order, interrupted ones resumed at the head
    for cell, order in zip(cells, orders, strict=True):
        await nothing_lost_order_kept(cell.redis, order, kills)
    # and worker processes ran jobs of both cells
    both = [w.worker_id for w in fleet.procs if all([await jobs_run(c, w) for c in cells])]
    assert both, "no worker process ran jobs in both cells"
    print(f"\ncells: {[len(o) for o in orders]} sessions, {len(kills)} workers killed, "
          f"{len(both)} of {len(fleet.procs)} worker processes ran jobs in both cells")
    # and neither Redis holds anything of the other cell's sessions or jobs
    for cell, order in zip(cells, orders, strict=True):
        assert await foreign_names(cell.redis, order) == []
