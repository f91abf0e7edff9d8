"""Fixtures of the reconciler tests: short-timed configs, the queue and store on the real Redis,
and a helper that puts sessions in a given state the way a worker does (fenced, under a lease)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.actor_names import actor_name
from common.config import Config, parse_config
from common.queue import JobKind, JobRecord, JobState, NewJob, Queue
from common.redis.client import RedisClient
from common.substrate import Actor, NotFound, SubstrateClient, make_substrate_client
from common.tool_calls import ToolCall
from local_substrate.server import LocalSubstrate
from local_substrate.store import Status
from reconciler.store import ReconcilerStore

ENV = "renv"


def reconciler_config(redis_url: str, state_dir: Path | str = "/tmp/unused", **sections: Any) -> Config:
    """Fast timings for tests; `sections` override top-level config sections (merged one level)."""
    data: dict[str, Any] = {
        "state_dir": str(state_dir),
        "redis": {"url": redis_url},
        "environments": [{"name": ENV, "idle_timeout_s": 1}],
        "workers": {"lease_ttl_s": 1.0, "retry_backoff_base_s": 0.05, "retry_backoff_max_s": 0.3},
        "reconciler": {"period_s": 0.2, "sync_period_s": 0.3, "gc_period_s": 5, "leader_ttl_s": 1.0,
                       "stuck_after_s": 0.5},
    }
    for name, value in sections.items():
        data[name] = {**data[name], **value} if isinstance(value, dict) and name in data else value
    return parse_config(data)


@pytest.fixture
def config(redis_url: str) -> Config:
    return reconciler_config(redis_url)


@pytest.fixture
async def queue(redis_url: str, config: Config) -> AsyncIterator[Queue]:
    async with RedisClient.from_url(redis_url) as client:
        yield Queue(client, config)


@pytest.fixture
def store(queue: Queue) -> ReconcilerStore:
    return ReconcilerStore(queue.redis, queue.keys)


async def wait_for(cond: Callable[[], Awaitable[bool]], timeout_s: float, what: str,
                   every_s: float = 0.05) -> float:
    """Poll `cond` until true; the seconds it took. Fails with `what` after timeout_s."""
    started = time.monotonic()
    while not await cond():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(every_s)
    return time.monotonic() - started


async def set_session(queue: Queue, sid: str, env: str = ENV, **fields: str) -> None:
    """Give a session these worker-maintained fields: a job runs under its lease (so the session
    exists as the queue makes it), then the fields are written as they would stand afterwards
    (finishing a job stamps `last_activity` itself, which a test may need to back-date)."""
    await queue.enqueue(NewJob(env, sid, JobKind.TOOL, {"test": True}, "tester"))
    session = f"{env}/{sid}"
    for _ in range(100):
        for acquired in await queue.take_work("test-setter", 100):
            await queue.complete(acquired.lease, acquired.job.id, JobState.SUCCEEDED, result={})
        if await queue.queue_depth(env, sid) == 0:
            await queue.redis.hset(queue.keys.session(session), fields)
            return
    raise AssertionError(f"could not set fields of {session}")


# -- the whole loop: real local Substrate, real workers, real reconcilers ---------------------------

@dataclass
class Running:
    """A service task started by a test (worker or reconciler) and its stop event."""

    name: str
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def halt(self, timeout_s: float = 30.0) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout_s)


@dataclass
class Fleet:
    """A local Substrate, a client of it, the queue, and the services a test starts."""

    config: Config
    server: LocalSubstrate
    client: SubstrateClient
    queue: Queue
    running: list[Running] = field(default_factory=list)

    @property
    def atespace(self) -> str:
        return self.config.environments[0].atespace

    def _start(self, name: str, serve: Callable[[asyncio.Event], Awaitable[None]]) -> Running:
        stop = asyncio.Event()
        svc = Running(name, stop, asyncio.create_task(serve(stop), name=name))
        self.running.append(svc)
        return svc

    def start_worker(self, worker_id: str = "w1") -> Running:
        from workers.main import serve_worker  # the whole worker: imported by the tests that run one

        return self._start(worker_id, lambda stop: serve_worker(self.config, worker_id, stop=stop))

    def start_reconciler(self, instance_id: str = "r1") -> Running:
        from reconciler.main import serve_reconciler

        return self._start(instance_id,
                           lambda stop: serve_reconciler(self.config, stop, instance_id=instance_id))

    async def enqueue(self, sid: str, kind: JobKind, payload: dict[str, Any] | None = None) -> str:
        return (await self.queue.enqueue(NewJob(ENV, sid, kind, payload or {}, "tester"))).job_id

    async def wait_job(self, job_id: str, timeout_s: float = 30.0) -> JobRecord:
        async def done() -> bool:
            job = await self.queue.get_job(job_id)
            return job is not None and job.terminal
        await wait_for(done, timeout_s, f"job {job_id} to finish")
        job = await self.queue.get_job(job_id)
        assert job is not None
        return job

    async def run(self, sid: str, kind: JobKind, payload: dict[str, Any] | None = None,
                  timeout_s: float = 30.0) -> JobRecord:
        job = await self.wait_job(await self.enqueue(sid, kind, payload), timeout_s)
        assert job.state == "succeeded", job.error
        return job

    async def bash(self, sid: str, command: str, auto_resume: bool = False, **arguments: Any) -> str:
        """Enqueue a bash call (the API's job payload); its job id."""
        call = ToolCall(call_id=uuid.uuid4().hex[:8], name="bash", format="seed", auto_resume=auto_resume,
                        arguments={"command": command, **arguments})
        return await self.enqueue(sid, JobKind.TOOL, call.job_payload())

    async def session(self, sid: str) -> dict[str, str]:
        return await self.queue.get_session(ENV, sid) or {}

    async def actor(self, sid: str) -> Actor | None:
        try:
            return await self.client.get_actor(self.atespace, actor_name(ENV, sid))
        except NotFound:
            return None

    async def state_is(self, sid: str, state: str) -> bool:
        return (await self.session(sid)).get("state") == state

    def force_status(self, name: str, status: Status) -> None:
        """Fault injection behind Substrate's API: leave an actor in a transitional status."""
        control = self.server.control
        assert control is not None
        rec = control.store.get(self.atespace, name)
        assert rec is not None
        control.store.update(rec.evolve(status=status))

    async def close(self) -> None:
        for svc in reversed(self.running):
            if not svc.task.done():
                await svc.halt()
        await self.client.close()
        await self.server.stop()


@pytest.fixture
async def make_fleet(redis_url: str, queue: Queue) -> AsyncIterator[Callable[..., Awaitable[Fleet]]]:
    """Factory: `await make_fleet(reconciler={...})` → a started local Substrate + queue (no services)."""
    fleets: list[Fleet] = []
    dirs: list[Path] = []

    async def make(**sections: Any) -> Fleet:
        state_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
        dirs.append(state_dir)
        local = {"slots": 6, "stop_grace_s": 1, **sections.pop("local_substrate", {})}
        config = reconciler_config(redis_url, state_dir, local_substrate=local, **sections)
        server = LocalSubstrate(config, "127.0.0.1:0")
        await server.start()
        client = make_substrate_client(config, server.address)
        await client.ensure_atespace(config.environments[0].atespace)
        fleet = Fleet(config, server, client, Queue(queue.redis, config))
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        await fleet.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
