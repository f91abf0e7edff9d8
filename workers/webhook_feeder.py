"""The feeder: turns terminal job events with a callback into webhook delivery jobs for arq.

It reads the queue's `callbacks` stream (the terminal events of jobs that have a callback_url,
written next to `events` by the queue's scripts) in its own consumer group (`webhooks`). For an
event of a terminal state with `cb="1"` it enqueues the arq job `webhook:<job id>`; arq refuses a
second job with the same id while the first is queued, running or its result is kept, and a
delivery whose final attempt is recorded on the job is never made again, so events read twice
collapse into one delivery.

The entry is acknowledged only after the enqueue, so a feeder that dies in between leaves it
pending and it is handled again: by the same consumer when it restarts (it first reads its own
pending entries), or by another one that claims entries idle for `CLAIM_IDLE_MS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeGuard

from common.logs import redact
from common.queue import TERMINAL_STATES
from common.queue.models import text
from common.redis.client import ClaimedEntry, RedisClient, StreamEntry
from common.redis.errors import RedisError, ResponseError

logger = logging.getLogger(__name__)

#: Consumer group of the deliverers on the `callbacks` stream.
FEEDER_GROUP = "webhooks"

#: How long one blocking read waits (ms); also bounds how long a stop request takes to be seen.
FEED_BLOCK_MS = 500

#: Entries read per call.
FEED_BATCH = 200

#: Pending entries of another consumer idle this long (ms) are taken over (it is presumed dead).
CLAIM_IDLE_MS = 10_000

#: How often (s) to look for such entries.
CLAIM_PERIOD_S = 5.0

#: Back-off (s) after a Redis error before reading again.
ERROR_BACKOFF_S = 1.0

#: Enqueues the delivery of one job's webhook.
Enqueue = Callable[[str], Awaitable[None]]


class EventFeeder:
    """Reads `events` as consumer `consumer` of group `webhooks` and enqueues deliveries."""

    def __init__(self, redis: RedisClient, events_key: str, consumer: str, enqueue: Enqueue) -> None:
        self._redis = redis
        self._events = events_key
        self._consumer = consumer
        self._enqueue = enqueue

    async def run(self, stop: asyncio.Event) -> None:
        """Feed until `stop` is set; the current batch is always finished and acknowledged first."""
        loop = asyncio.get_running_loop()
        resumed = False
        next_claim = 0.0
        while not stop.is_set():
            try:
                if not resumed:
                    await self.ensure_group()
                    await self._drain_own_pending()
                    resumed = True
                if loop.time() >= next_claim:
                    await self._claim_stale()
                    next_claim = loop.time() + CLAIM_PERIOD_S
                await self._handle(await self._read(">", FEED_BLOCK_MS))
            except RedisError as err:
                # Redis restarting or failing over (maybe without its data: NOGROUP): keep the role
                # alive, and set the group up again before reading on.
                logger.warning("webhook feeder: redis error, retrying: %s", redact(str(err)))
                resumed = False
                await _sleep_or_stop(stop, ERROR_BACKOFF_S)

    async def ensure_group(self) -> None:
        """Create the group at the start of the stream, so events written before the first start count."""
        try:
            await self._redis.xgroup_create(self._events, FEEDER_GROUP, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def _drain_own_pending(self) -> None:
        """Entries this consumer read but did not acknowledge before it stopped."""
        while entries := await self._read("0", None):
            await self._handle(entries)

    async def _claim_stale(self) -> None:
        cursor = "0-0"
        while True:
            reply = await self._redis.xautoclaim(
                self._events, FEEDER_GROUP, self._consumer, CLAIM_IDLE_MS, start_id=cursor, count=FEED_BATCH
            )
            cursor, claimed = text(reply[0]), reply[1]
            await self._handle([e for e in claimed if _live(e)])
            if cursor == "0-0":
                return

    async def _read(self, start: str, block_ms: int | None) -> list[StreamEntry]:
        reply = await self._redis.xreadgroup(
            FEEDER_GROUP, self._consumer, {self._events: start}, count=FEED_BATCH, block_ms=block_ms
        )
        return [entry for _stream, entries in reply or [] for entry in entries]

    async def _handle(self, entries: list[StreamEntry]) -> None:
        if not entries:
            return
        for _entry_id, fields in entries:
            job_id = _webhook_job(fields)
            if job_id is not None:
                await self._enqueue(job_id)
        await self._redis.xack(self._events, FEEDER_GROUP, *(entry_id for entry_id, _ in entries))


def _live(entry: ClaimedEntry) -> TypeGuard[StreamEntry]:
    """Not an entry trimmed from the stream meanwhile (Redis 6.2 claims those as (None, None))."""
    return entry[0] is not None


def _webhook_job(fields: dict[Any, Any]) -> str | None:
    """The job id of an event that calls for a webhook (terminal state, callback set), else None."""
    event = {text(k): text(v) for k, v in fields.items()}
    if event.get("cb") != "1" or event.get("state") not in TERMINAL_STATES:
        return None
    job_id = event.get("job")
    if not job_id:
        logger.warning("webhook feeder: event without a job id skipped: %s", event)
    return job_id or None


async def _sleep_or_stop(stop: asyncio.Event, delay_s: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        pass
