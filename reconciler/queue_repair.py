"""Queue repair pass: drive the queue's repair primitives and publish queue depth and age.

The primitives (expired leases, due delayed sessions, workers whose announcement of free slots
lapsed, work nobody owns or was told about) belong to `common.queue`; this pass only calls them
every period, in the order that lets one pass recover a crashed worker's session, and measures
the queue.
"""

from __future__ import annotations

import asyncio
import time

from common.metrics import OLDEST_JOB_AGE
from common.queue import Queue
from common.queue.models import text
from reconciler.report import PassReport

#: Sessions of the `work` index whose head job is looked at for the oldest-job age.
OLDEST_SAMPLE = 16


async def queue_repair_pass(queue: Queue, report: PassReport) -> None:
    """One round of every repair primitive; counts go to the report by kind."""
    for kind, n in (await queue.repair()).items():
        report.repaired(kind, n)
    report.examined += await queue.redis.zcard(queue.keys.work)
    OLDEST_JOB_AGE.set(await oldest_job_age_s(queue))


async def oldest_job_age_s(queue: Queue) -> float:
    """Age of the oldest head job among the sessions waiting longest for work (0 when none).

    `work` is scored by when a session's FIFO became non-empty, so its first members hold the
    oldest jobs; their head job's creation time is the exact age.
    """
    sessions = await queue.redis.zrange(queue.keys.work, 0, OLDEST_SAMPLE - 1)
    if not sessions:
        return 0.0
    firsts = await asyncio.gather(*(queue.redis.lindex(queue.keys.fifo(text(s)), 0) for s in sessions))
    heads = [text(h) for h in firsts if h]
    times = await asyncio.gather(*(queue.redis.hget(queue.keys.job(jid), "ct") for jid in heads))
    created = [int(c) for c in times if c]
    return max(0.0, time.time() - min(created) / 1000) if created else 0.0
