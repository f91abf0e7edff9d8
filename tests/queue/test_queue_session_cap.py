"""The cap on queued jobs per session (issue 13), on the real queue: a full session's enqueue is
refused whole, and other sessions, the same principal's included, are unaffected."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from common.config import QuotaLimits
from common.queue import JobKind, NewJob, Queue
from common.queue.models import QuotaRefused, Tenancy


def call(sid: str) -> NewJob:
    return NewJob("env", sid, JobKind.TOOL, {"name": "bash"}, "key:t", tenancy=Tenancy.OWN)


async def test_a_full_session_is_refused_and_others_are_not(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    cap = QuotaLimits(jobs_queued_per_session=3)
    for _ in range(3):
        await queue.enqueue(call("busy"), quotas=cap)
    # when the session is at its cap, one more job (alone or in a batch) is refused, nothing written
    with pytest.raises(QuotaRefused) as refused:
        await queue.enqueue(call("busy"), quotas=cap)
    assert refused.value.quota == "jobs_queued_per_session" and refused.value.retry_after_s
    with pytest.raises(QuotaRefused):
        await queue.enqueue_batch([call("calm"), call("busy")], quotas=cap)
    assert await redis_client.llen("af:sq:{env/busy}") == 3
    assert await redis_client.llen("af:sq:{env/calm}") == 0
    # then another session of the same principal still takes jobs
    assert (await queue.enqueue(call("calm"), quotas=cap)).created


def test_sessions_are_capped_by_default() -> None:
    assert QuotaLimits().jobs_queued_per_session > 0
