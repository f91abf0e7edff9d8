"""What one reconciler pass did, and how it is measured: a histogram, counters and a log line."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from common.metrics import RECONCILER_PASS_SECONDS, RECONCILER_REPAIRS

log = logging.getLogger("atefleet.reconciler")


@dataclass
class PassReport:
    """Items a pass examined and the repairs it made, by kind."""

    name: str
    examined: int = 0
    repairs: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0

    def repaired(self, kind: str, n: int = 1) -> None:
        if n:
            self.repairs[kind] += n

    def merge(self, other: PassReport) -> None:
        self.examined += other.examined
        self.repairs.update(other.repairs)


async def measured(name: str, run: Callable[[PassReport], Awaitable[None]]) -> PassReport:
    """Run one pass filling a fresh report, then record its duration, repairs and a log line."""
    report = PassReport(name)
    started = time.perf_counter()
    try:
        await run(report)
    finally:
        report.duration_s = time.perf_counter() - started
        RECONCILER_PASS_SECONDS.labels(pass_name=name).observe(report.duration_s)
        for kind, n in report.repairs.items():
            RECONCILER_REPAIRS.labels(kind=kind).inc(n)
        # A pass that repaired nothing is routine (one per period): debug, so logs show the drifts.
        level = logging.INFO if report.repairs else logging.DEBUG
        log.log(level, "reconciler pass", extra={"fields": {
            "pass": name, "duration_ms": round(report.duration_s * 1000, 1), "examined": report.examined,
            "repairs": dict(report.repairs)}})
    return report
