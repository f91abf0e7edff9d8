"""The worker's turn: its transition table (as documented), and lease losses on real Redis while a
handler runs and while its outcome is being written."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from queue_testkit import REPO_ROOT, job, terminal_event_counts, wait_for

from common.config import parse_config
from common.queue import Consumer, Handler, JobContext, JobState, LeaseLost, Queue
from common.queue.scripts import Lease
from common.queue.turn import TRANSITIONS, Turn, TurnEvent, TurnState

Runs = list[tuple[str, int, str]]  # (worker, epoch, job id) per handler run, in order


# -- the table -----------------------------------------------------------------------------------
def documented_transitions() -> dict[tuple[TurnState, TurnEvent], tuple[TurnState, bool]]:
    """The table under "The worker's turn" in docs/architecture.md."""
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The worker's turn", 1)[1].split("\n## ", 1)[0]
    row = re.compile(r"^\| `(\w+)` \| `(\w+)` \| `(\w+)` \| (cancelled)? ?\|$", re.MULTILINE)
    return {(TurnState(s), TurnEvent(e)): (TurnState(n), bool(c)) for s, e, n, c in row.findall(section)}


def test_the_documented_table_is_the_transition_table() -> None:
    assert documented_transitions() == TRANSITIONS


@pytest.fixture
async def turn() -> AsyncIterator[Turn]:
    """A turn whose task stands in for a handler (it sleeps until cancelled)."""
    task = asyncio.create_task(asyncio.sleep(60))
    yield Turn(Lease("env/s", "w", 1), task, expires_at=0.0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_loss_cancels_the_task_only_while_a_handler_runs(turn: Turn) -> None:
    # given a turn whose handler ran and whose outcome write is in flight
    assert turn.on(TurnEvent.BEGIN) and turn.on(TurnEvent.HANDLED)
    # when a renewal finds the lease gone (the write may have released it): nothing happens
    assert not turn.on(TurnEvent.REFUSED)
    assert turn.state is TurnState.FINISHING and turn.task.cancelling() == 0
    # when the write itself is refused: lost, and the task (not in a handler) is left alone
    assert turn.on(TurnEvent.LOST)
    assert turn.state is TurnState.LOST and turn.task.cancelling() == 0
    # then nothing else moves it: no job begins, a stop or a cancellation changes nothing
    for event in (TurnEvent.BEGIN, TurnEvent.DEADLINE, TurnEvent.CANCELLED, TurnEvent.RELEASED):
        assert not turn.on(event) and turn.state is TurnState.LOST


async def test_a_refused_renewal_while_handling_is_a_loss_that_cancels_the_handler(turn: Turn) -> None:
    turn.on(TurnEvent.BEGIN)
    assert turn.on(TurnEvent.REFUSED)
    assert turn.state is TurnState.LOST and turn.task.cancelling() == 1
    # the cancelled task ends the turn as lost (it is not taken for a stop, so nothing is released)
    assert not turn.on(TurnEvent.CANCELLED) and turn.state is TurnState.LOST


async def test_the_stop_deadline_cancels_a_handler_and_no_job_begins_after_it(turn: Turn) -> None:
    turn.on(TurnEvent.BEGIN)
    assert turn.on(TurnEvent.DEADLINE)
    assert turn.state is TurnState.STOPPING and turn.task.cancelling() == 1
    assert not turn.on(TurnEvent.CANCELLED) and not turn.on(TurnEvent.BEGIN)
    assert turn.state is TurnState.STOPPING  # the turn releases the session as it ends


async def test_the_stop_deadline_lets_an_outcome_write_finish(turn: Turn) -> None:
    turn.on(TurnEvent.BEGIN)
    turn.on(TurnEvent.HANDLED)
    assert turn.on(TurnEvent.DEADLINE) and turn.task.cancelling() == 0
    # a write that released the session ends the turn: nothing is left to release
    assert turn.on(TurnEvent.RELEASED) and turn.state is TurnState.ENDED


# -- lease losses on real Redis ------------------------------------------------------------------
async def lapse_and_repair(queue: Queue, redis: aioredis.Redis, session: str = "env/s") -> None:
    """The lease lapses behind its holder's back (as after a stall) and the reconciler's repair
    gives the session a new epoch and hands it on."""
    await redis.delete(f"af:lease:{{{session}}}")
    await redis.zadd("af:active", {session: 0})  # its expiry time has passed
    assert await queue.repair_expired_leases() == 1


async def announced(redis: aioredis.Redis, worker_id: str) -> bool:
    return (await redis.zscore("af:idle", worker_id) or 0) > 0


async def all_terminal(queue: Queue, ids: list[str]) -> bool:
    recs = [await queue.get_job(jid) for jid in ids]
    return all(r is not None and r.terminal for r in recs)


async def resumed_at_the_head_elsewhere(
    queue: Queue, redis: aioredis.Redis, runs: Runs, ids: list[str], lost_worker: Consumer
) -> None:
    """The interrupted job ran again first, on w2 under a newer epoch; each job ended once, by w2."""
    [(w1, e1, j1), (w2, e2, j2), (w3, e3, j3)] = runs
    assert (w1, j1) == ("w1", ids[0]) and (w2, j2) == ("w2", ids[0]) and (w3, j3) == ("w2", ids[1])
    assert e2 == e3 > e1
    first = await queue.get_job(ids[0])
    assert first is not None and first.state == JobState.SUCCEEDED
    assert first.result == {"worker": "w2", "epoch": e2} and first.epoch == e2
    counts = await terminal_event_counts(redis)
    assert [counts.get(jid) for jid in ids] == [1, 1]
    assert lost_worker.stats["jobs"] == 0 and lost_worker.stats["leases_lost"] == 1


async def test_lease_lost_while_handling_refuses_its_writes_and_the_job_resumes_elsewhere(
    queue: Queue, start_consumer: Callable[..., Consumer], redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="atefleet.queue.consumer")
    runs: Runs = []
    contexts: list[JobContext] = []
    refused: list[str] = []

    def handler_of(worker: str) -> Handler:
        async def handler(ctx: JobContext) -> dict[str, Any]:
            runs.append((worker, ctx.epoch, ctx.job.id))
            contexts.append(ctx)
            if len(runs) > 1:
                return {"worker": worker, "epoch": ctx.epoch}
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                # a handler cleaning up after the loss can write nothing
                for name, write in (("update_session", lambda: ctx.update_session(state="stale")),
                                    ("take_secrets", ctx.take_secrets)):
                    try:
                        await write()
                    except LeaseLost:
                        refused.append(name)
                raise
            return {}

        return handler

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    lost = start_consumer(handler_of("w1"), worker_id="w1", concurrency=1)
    await wait_for(lambda: _true(bool(runs)), 5, "w1 to start the first job")
    start_consumer(handler_of("w2"), worker_id="w2")
    await wait_for(lambda: announced(redis_client, "w2"), 5, "w2 to announce its slots")
    # when w1's lease lapses while its handler runs
    await lapse_and_repair(queue, redis_client)
    # then w1's renewal finds it gone: the handler is told and cancelled, and its writes are refused
    await wait_for(lambda: _true(len(refused) == 2), 5, "w1's handler to be cancelled")
    assert refused == ["update_session", "take_secrets"]
    assert contexts[0].lease_lost and contexts[0].cancelled.is_set()
    assert "lease lost: session=env/s" in caplog.text
    # and the job resumes at the head on w2, which finishes the session's jobs in order
    await wait_for(lambda: all_terminal(queue, ids), 10, "w2 to finish both jobs")
    await resumed_at_the_head_elsewhere(queue, redis_client, runs, ids, lost)
    session = await queue.get_session("env", "s")
    assert session is not None and session.get("state") != "stale"


#: Renewals every 5 s: a loss is found by the outcome write, not by a renewal.
LONG_LEASE = parse_config({"workers": {"lease_ttl_s": 15.0, "jobs_per_turn": 4}})


@pytest.mark.parametrize("queue_config", [LONG_LEASE])
async def test_lease_lost_while_finishing_refuses_the_outcome_and_the_job_resumes_elsewhere(
    queue: Queue, start_consumer: Callable[..., Consumer], redis_client: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="atefleet.queue.consumer")
    runs: Runs = []
    w2_ready = asyncio.Event()

    def handler_of(worker: str) -> Handler:
        async def handler(ctx: JobContext) -> dict[str, Any]:
            runs.append((worker, ctx.epoch, ctx.job.id))
            if len(runs) == 1:
                await w2_ready.wait()
                await lapse_and_repair(queue, redis_client)  # the lease lapses as the handler returns
            return {"worker": worker, "epoch": ctx.epoch}

        return handler

    ids = [(await queue.enqueue(job("s", i))).job_id for i in range(2)]
    lost = start_consumer(handler_of("w1"), worker_id="w1", concurrency=1)
    await wait_for(lambda: _true(bool(runs)), 5, "w1 to start the first job")
    start_consumer(handler_of("w2"), worker_id="w2")
    await wait_for(lambda: announced(redis_client, "w2"), 5, "w2 to announce its slots")
    # when w1's lease lapses between its handler's end and the outcome's write
    w2_ready.set()
    # then the write is refused and w1 records nothing; the job resumes at the head on w2
    await wait_for(lambda: all_terminal(queue, ids), 10, "w2 to finish both jobs")
    await resumed_at_the_head_elsewhere(queue, redis_client, runs, ids, lost)
    assert f"could not record the outcome of job {ids[0]}" in caplog.text


async def _true(value: bool) -> bool:
    return value
