"""The webhook deliverer (`atefleet webhooks` role): signed completion callbacks, retried by arq.

Flow: a job with a `callback_url` reaches a terminal state → the queue writes an `events` entry
with `cb="1"` → the feeder (workers/webhook_feeder.py) enqueues the arq job `webhook:<job id>` →
`deliver_webhook` POSTs `{"type": "job.completed", "timestamp": <finished_at>, "data": <job JSON>}`
signed per Standard Webhooks (workers/webhook_sender.py, common/webhook_signing.py) to the URL,
through the SSRF guard (workers/webhook_target.py), and records the attempt on the job (visible
in its JSON). This module owns the arq task, its settings and the role's process wiring.

Retries follow `webhooks.retry_schedule_s`: entry i is the delay before attempt i (the first,
normally 0, applies to the first attempt), so there are as many attempts as entries. 2xx = done;
410 = the receiver asks us to stop; a refused target or an unknown secret id is permanent; any
other answer or network error is retried, after the receiver's `Retry-After` (seconds or an HTTP
date, capped at the longest scheduled delay) when it sends one. The attempt count comes from the
attempts recorded on the job, not from arq's try counter, so a restart of the deliverer never
skips or repeats a slot; a job whose last recorded attempt was final is never posted again.
`webhook-id` is the job id on every attempt, so receivers can deduplicate (delivery is
at-least-once: a deliverer killed between the POST and the record sends it once more).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from typing import Any, Protocol

from arq.connections import ArqRedis
from arq.worker import Retry, Worker, func

from common.config import Config, WebhookConfig
from common.event_loop import run_network_role
from common.job_json import rfc3339
from common.logs import log_context, redact
from common.metrics import WEBHOOK_ATTEMPTS, serve_role_endpoints
from common.queue import JobRecord, Keys, Queue
from common.redis.client import RedisClient
from common.redis.errors import RedisError
from common.redis.settings import RedisSettings, role_settings
from common.signals import stop_on_signals
from workers.webhook_feeder import EventFeeder
from workers.webhook_sender import AttemptOutcome, WebhookSender, next_delay_s
from workers.webhook_target import make_client

logger = logging.getLogger(__name__)

#: arq's queue polling period (s): with the feeder's blocking read this bounds the added latency.
POLL_DELAY_S = 0.05

#: Deliveries in flight per deliverer process (they mostly wait on the network).
MAX_CONCURRENT_DELIVERIES = 100

#: Slack (s) on top of the HTTP timeout before arq itself gives up on a delivery task.
JOB_TIMEOUT_SLACK_S = 10.0

#: Extra arq tries beyond the schedule, absorbing runs cancelled by deliverer restarts.
RESTART_TRIES = 20

#: Delay (s) before trying again when Redis failed while reading or recording an attempt.
REDIS_RETRY_S = 5.0

#: How long a graceful stop lets in-flight deliveries finish (s) before cancelling them.
STOP_GRACE_S = 5.0


class JobStore(Protocol):
    """What delivery needs from the queue."""

    async def get_job(self, job_id: str) -> JobRecord | None: ...

    async def record_webhook_attempt(self, job_id: str, attempt: dict[str, Any]) -> int: ...


def arq_queue_name(prefix: str) -> str:
    """arq's queue (a zset) of webhook deliveries, under the fleet's key prefix."""
    return f"{prefix}arq:webhooks"


def arq_job_id(job_id: str) -> str:
    """One arq job per fleet job: enqueuing twice collapses into one delivery."""
    return f"webhook:{job_id}"


def delivery_finished(job: JobRecord) -> bool:
    """True when the last recorded attempt ended delivery (no further attempt was planned)."""
    return bool(job.webhook_attempts) and job.webhook_attempts[-1].get("next_attempt_at") is None


class WebhookDelivery:
    """One run of the arq task: the next attempt of a job's callback, recorded, and the retry planned."""

    def __init__(self, store: JobStore, sender: WebhookSender, schedule: tuple[float, ...]) -> None:
        self._store = store
        self._sender = sender
        self._schedule = schedule

    async def deliver(self, job_id: str) -> str:
        """Attempt delivery; raise arq's Retry to be run again after the planned delay."""
        try:
            job = await self._store.get_job(job_id)
            if job is None or job.callback_url is None:
                return "job gone"
            if delivery_finished(job):
                return "already finished"
            return await self._attempt(job, job.callback_url)
        except RedisError as err:
            logger.warning("webhook delivery: redis error, retrying: %s", redact(str(err)))
            raise Retry(defer=REDIS_RETRY_S) from err

    async def _attempt(self, job: JobRecord, url: str) -> str:
        started_at = time.time()
        outcome = await self._sender.post(job, url)
        delay = next_delay_s(self._schedule, len(job.webhook_attempts) + 1, outcome)
        await self._store.record_webhook_attempt(job.id, _attempt_record(started_at, outcome, delay))
        label = _outcome_label(outcome, delay)
        WEBHOOK_ATTEMPTS.labels(outcome=label).inc()
        logger.info("webhook attempt", extra={"fields": {"outcome": label, "status": outcome.status,
                                                        "error": outcome.error}})
        if delay is not None:
            raise Retry(defer=delay)
        return label


def _attempt_record(started_at: float, outcome: AttemptOutcome, delay: float | None) -> dict[str, Any]:
    """The attempt as shown in the job JSON's `webhook_attempts`."""
    next_at = None if delay is None else rfc3339(time.time() + delay)
    return {
        "time": rfc3339(started_at),
        "status": outcome.status,
        "error": outcome.error,
        "duration_ms": outcome.duration_ms,
        "next_attempt_at": next_at,
    }


def _outcome_label(outcome: AttemptOutcome, delay: float | None) -> str:
    if delay is not None:
        return "retrying"
    if outcome.status is not None and 200 <= outcome.status < 300:
        return "delivered"
    if outcome.status == 410:
        return "stopped"
    return "refused" if outcome.final else "exhausted"


async def deliver_webhook(ctx: dict[str, Any], job_id: str) -> str:
    """The arq task: one delivery attempt of `job_id`'s callback (see WebhookDelivery)."""
    delivery: WebhookDelivery = ctx["delivery"]
    with log_context(job=job_id):
        return await delivery.deliver(job_id)


def _json_dumps(value: Any) -> bytes:
    # JSON rather than arq's default pickle: nothing read back from Redis can run code.
    return json.dumps(value).encode()


def worker_settings(config: Config) -> dict[str, Any]:
    """arq Worker keyword arguments for the deliverer, built from the fleet's config."""
    hooks = config.webhooks
    tries = len(hooks.retry_schedule_s) + RESTART_TRIES
    return {
        "functions": [func(deliver_webhook, name="deliver_webhook", max_tries=tries)],
        "queue_name": arq_queue_name(config.redis_prefix),
        "poll_delay": POLL_DELAY_S,
        "max_jobs": MAX_CONCURRENT_DELIVERIES,
        "job_timeout": hooks.timeout_s + JOB_TIMEOUT_SLACK_S,
        "keep_result": config.jobs.ttl_s,
        "max_tries": tries,
        "job_serializer": _json_dumps,
        "job_deserializer": json.loads,
        "expires_extra_ms": _arq_job_lifetime_ms(hooks),
        "log_results": False,
    }


def _arq_job_lifetime_ms(hooks: WebhookConfig) -> int:
    """arq drops a job this long after it was first due; it must outlive every retry."""
    longest = max(hooks.retry_schedule_s)
    worst_case_s = len(hooks.retry_schedule_s) * (longest + hooks.timeout_s + JOB_TIMEOUT_SLACK_S)
    return int((worst_case_s + 3600) * 1000)


class Deliverer:
    """The webhooks role in one process: the event feeder on the fleet's Redis client, the arq
    worker on a redis-py pool (arq needs one) made from the same settings."""

    def __init__(self, config: Config, redis: RedisSettings, consumer: str | None = None) -> None:
        self._config = config
        self._settings = redis
        #: Stable per host by default, so a restarted deliverer finds its own unacknowledged events.
        self._consumer = consumer or socket.gethostname()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        settings = worker_settings(self._config)
        self._client = RedisClient(self._settings)
        self._pool = ArqRedis(
            self._settings.connection_pool(),
            job_serializer=settings["job_serializer"],
            job_deserializer=settings["job_deserializer"],
            default_queue_name=settings["queue_name"],
            expires_extra_ms=settings["expires_extra_ms"],
        )
        self._http = make_client(self._config.webhooks)
        sender = WebhookSender(self._config.webhooks, self._http)
        schedule = self._config.webhooks.retry_schedule_s
        self._queue = Queue(self._client, self._config)
        delivery = WebhookDelivery(self._queue, sender, schedule)
        ctx = {"delivery": delivery}
        self._worker = Worker(**settings, redis_pool=self._pool, handle_signals=False, ctx=ctx)
        events = Keys(self._config.redis_prefix).callbacks
        feeder = EventFeeder(self._client, events, self._consumer, self._enqueue)
        # The group exists before start() returns: events written from now on are never missed.
        await feeder.ensure_group()
        self._tasks = [
            asyncio.create_task(feeder.run(self._stop), name="webhook-feeder"),
            asyncio.create_task(self._worker.async_run(), name="webhook-worker"),
        ]

    async def _enqueue(self, job_id: str) -> None:
        first_delay_s = self._config.webhooks.retry_schedule_s[0]
        await self._pool.enqueue_job(
            "deliver_webhook", job_id, _job_id=arq_job_id(job_id), _defer_by=first_delay_s
        )

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set or a part fails (its error is raised after a clean stop)."""
        stop_wait = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([stop_wait, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            await self.stop()
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed") from task.exception()

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop feeding, let in-flight deliveries finish for `grace_s`, then cancel the rest."""
        if self._stop.is_set():
            return
        # The feeder goes first: it finishes and acknowledges its batch while the shared pool is
        # still open, and enqueues nothing for a worker that is going away.
        self._stop.set()
        feeder, worker = self._tasks
        await asyncio.wait([feeder])
        self._worker.allow_pick_jobs = False
        in_flight = [t for t in self._worker.tasks.values() if not t.done()]
        if in_flight:
            await asyncio.wait(in_flight, timeout=grace_s)
        # Cancelled deliveries stay queued in arq and run again after a restart. (Not
        # Worker.close(): it closes the pool with a call redis-py deprecates.)
        remaining = [t for t in self._worker.tasks.values() if not t.done()]
        for task in [*remaining, worker]:
            task.cancel()
        await asyncio.wait([*remaining, worker])
        with contextlib.suppress(RedisError):
            await self._pool.delete(self._worker.health_check_key)
        await self._pool.aclose(close_connection_pool=True)
        await self._client.aclose()
        await self._http.aclose()


async def serve_deliverer(
    config: Config, redis_url: str, metrics_port: int = 0, stop: asyncio.Event | None = None
) -> None:
    """Deliver callbacks until `stop` is set (SIGTERM/SIGINT when `stop` is None)."""
    settings = role_settings("webhooks", redis_url)
    stop = stop or stop_on_signals()
    deliverer = Deliverer(config, settings)
    await deliverer.start()
    endpoints = await serve_role_endpoints("0.0.0.0", metrics_port, lambda: True) if metrics_port else None
    logger.info("webhook deliverer started", extra={"fields": {"queue": arq_queue_name(config.redis_prefix)}})
    try:
        await deliverer.serve(stop)
    finally:
        if endpoints is not None:
            endpoints.close()
        logger.info("webhook deliverer stopped")


def run_deliverer(config: Config, redis_url: str, metrics_port: int = 0) -> None:
    """Entry point of `atefleet webhooks`."""
    run_network_role(serve_deliverer(config, redis_url, metrics_port))
