"""Prometheus metrics of every role, and the small HTTP endpoint non-API roles serve them on.

Under `atefleet up` all roles share one host, so they write to a prometheus_client multiprocess
directory ($PROMETHEUS_MULTIPROC_DIR, set by the supervisor before any child starts) and the API's
`/metrics` shows the whole fleet. In a cluster each pod is scraped on its own port instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["PROMETHEUS_CONTENT_TYPE"]

#: Latency buckets (seconds) from sub-millisecond guest calls to ~40 s cold resumes.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 40)

JOBS_FINISHED = Counter("atefleet_jobs_finished_total", "Jobs that reached a terminal state",
                        ["kind", "state"])
JOBS_ENQUEUED = Counter("atefleet_jobs_enqueued_total", "Jobs accepted by the API", ["kind"])
JOB_RETRIES = Counter("atefleet_job_retries_total", "Infrastructure retries of jobs", ["reason"])
LEASE_LOSSES = Counter("atefleet_lease_losses_total", "Session leases lost by a worker")
LIFECYCLE_LATENCY = Histogram("atefleet_actor_op_seconds", "Substrate actor operation latency",
                              ["op"], buckets=LATENCY_BUCKETS_S)
GUEST_CALL_LATENCY = Histogram("atefleet_guest_call_seconds", "Tool execution latency through the guest",
                               ["tool"], buckets=LATENCY_BUCKETS_S)
WEBHOOK_ATTEMPTS = Counter("atefleet_webhook_attempts_total", "Webhook delivery attempts", ["outcome"])
RECONCILER_PASS_SECONDS = Histogram("atefleet_reconciler_pass_seconds", "Reconciler pass duration",
                                    ["pass_name"], buckets=LATENCY_BUCKETS_S)
RECONCILER_REPAIRS = Counter("atefleet_reconciler_repairs_total", "Drifts repaired by the reconciler",
                             ["kind"])
HTTP_REQUESTS = Counter("atefleet_http_requests_total", "API requests", ["route", "status"])

# Gauges the reconciler's passes set from Redis (one live leader; "livemax" drops dead processes).
QUEUE_DEPTH = Gauge("atefleet_queue_depth", "Jobs queued across all sessions", multiprocess_mode="livemax")
OLDEST_JOB_AGE = Gauge("atefleet_oldest_queued_job_age_seconds", "Age of the oldest queued job",
                       multiprocess_mode="livemax")
SESSIONS_BY_STATE = Gauge("atefleet_sessions", "Sessions by state", ["state"], multiprocess_mode="livemax")
SUBSTRATE_WORKERS = Gauge("atefleet_substrate_workers", "Substrate workers (local slots) by state",
                          ["state"], multiprocess_mode="livemax")
CAPACITY_SESSIONS = Gauge("atefleet_capacity_sessions", "Sessions running, parked, waiting for a worker",
                          ["state"], multiprocess_mode="livemax")
CAPACITY_OLDEST_WAIT = Gauge("atefleet_capacity_oldest_wait_seconds", "First waiting resume's wait",
                             multiprocess_mode="livemax")
PARKS = Counter("atefleet_parks_total", "Sessions the fleet suspended on its own", ["reason"])


M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """The children of one labelled metric, each looked up once per label values.

    `metric.labels(...)` validates, converts and takes a lock on every call (a few µs), which a
    per-job path pays for nothing: its label values are few (job kinds and states, tool names).
    """

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


def render_metrics() -> bytes:
    """The exposition of this process, or of every fleet process in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest()


async def serve_role_endpoints(host: str, port: int, is_ready: Callable[[], bool]) -> asyncio.Server:
    """Serve /healthz, /readyz and /metrics for a role that has no HTTP API of its own.

    A deliberately tiny HTTP/1.0 responder: these endpoints are scraped and probed, never browsed.
    """

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            path = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "/"
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            if path.startswith("/metrics"):
                status, ctype, body = "200 OK", PROMETHEUS_CONTENT_TYPE, render_metrics()
            elif path.startswith("/healthz"):
                status, ctype, body = "200 OK", "application/json", b'{"status":"ok"}'
            elif path.startswith("/readyz"):
                ok = is_ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "application/json", b'{"ready":%s}' % (b"true" if ok else b"false")
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found"
            head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
