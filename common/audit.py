"""The audit log: an append-only record of security-relevant events, kept apart from `events`.

Records live in a Redis stream (`audit`, capped by `audit.stream_maxlen` and trimmed by age,
`audit.max_age_s`: an hour by default, the recent window `GET /v1/audit` reads, as a record costs
~150 bytes of Redis while kept) and, when `audit.jsonl` is set, are also written as JSON lines (a
file, or stdout with "-") by the process that saw them: the long-term copy, for shipping. A
record is flat text fields:

    ev         call | auth_failure | forbidden | ownership_denied | policy_denied | quota_refused |
               callback_secret_denied | admin
    pr         the principal (`key:NAME`, `jwt:SUB`, `anonymous`, or `-` when none was established)
    env, sid   the environment and session, when there is one
    op         the tool (calls) or the lifecycle operation / route
    job        the job id of an accepted call
    digest     sha1 of the call's recorded payload (never the env var values, which are not in it)
    why        what refused it (the policy rule's location, the quota's name, the problem detail)

The record of each accepted job is appended by the enqueue script itself (no extra round trip on
the hot path), its JSON line by `note_call`; every other event goes through `record`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from common.config import AuditConfig
from common.queue.keys import Keys
from common.redis.client import RedisClient

log = logging.getLogger("atefleet.audit")

#: Largest page `read` answers.
READ_MAX = 1000
#: Records `read` looks at per page at most while filtering (bounds one request's work).
SCAN_MAX = 20_000
#: How often buffered JSON lines are flushed (seconds): a crash loses at most this much of the
#: file copy; the Redis stream has the records anyway.
FLUSH_PERIOD_S = 1.0

AuditRecord = dict[str, str]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class AuditLog:
    """Appends and reads the audit stream of one fleet; owns the JSON lines sink of its process."""

    def __init__(self, redis: RedisClient, keys: Keys, config: AuditConfig) -> None:
        self.redis = redis
        self.key = keys.audit
        self.config = config
        self._sink: IO[str] | None = None
        if config.jsonl == "-":
            self._sink = sys.stdout
        elif config.jsonl:
            self._sink = open(config.jsonl, "a", encoding="utf-8")  # closed in aclose
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the periodic flush (JSON lines) and age trim (stream)."""
        self._task = asyncio.create_task(self._maintain(), name="audit-maintenance")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sink is not None:
            self._sink.flush()
            if self._sink is not sys.stdout:
                self._sink.close()

    async def record(self, ev: str, principal: str, **fields: str) -> None:
        """Append one record to the stream and the JSON lines sink. Never raises: an audit write
        that fails is logged, and the refusal it records is still answered."""
        values = {"ev": ev, "pr": principal or "-", **{k: v for k, v in fields.items() if v}}
        self._write_line(values, time.time())
        if self._sink is not None:
            self._sink.flush()  # refusals are rare and are what a shipper must not miss
        if self.config.stream_maxlen <= 0:
            return
        try:
            await self.redis.xadd(self.key, values, maxlen=self.config.stream_maxlen, approximate=True)
        except Exception:  # the refusal stands without its record; say so loudly
            log.exception("audit record %s of %s not stored", ev, principal)

    def note_call(self, principal: str, environment: str, session_id: str, op: str, job_id: str) -> None:
        """The JSON line of an accepted call (its stream record was written by the enqueue script)."""
        if self._sink is not None:
            self._write_line(
                {
                    "ev": "call",
                    "pr": principal,
                    "env": environment,
                    "sid": session_id,
                    "op": op,
                    "job": job_id,
                },
                time.time(),
            )

    def _write_line(self, values: Mapping[str, str], at_s: float) -> None:
        if self._sink is not None:
            self._sink.write(json.dumps({"t": round(at_s, 3), **values}, separators=(",", ":")) + "\n")

    async def read(
        self,
        *,
        principal: str = "",
        session: str = "",
        since_ms: int = 0,
        until_ms: int = 0,
        cursor: str = "",
        limit: int = 100,
    ) -> tuple[list[AuditRecord], str | None]:
        """Records oldest first, filtered; (page, cursor to pass for the next page, or None)."""
        low = f"({cursor}" if cursor else (str(since_ms) if since_ms else "-")
        high = str(until_ms) if until_ms else "+"
        page: list[AuditRecord] = []
        scanned = 0
        while len(page) < limit and scanned < SCAN_MAX:
            batch = await self.redis.xrange(self.key, min=low, max=high, count=min(SCAN_MAX, limit * 4))
            if not batch:
                return page, None
            for entry_id, raw in batch:
                scanned += 1
                low = f"({_text(entry_id)}"
                record = _record(_text(entry_id), raw)
                if (not principal or record.get("pr") == principal) and (
                    not session or record.get("sid") == session
                ):
                    page.append(record)
                    if len(page) == limit:
                        break
        return page, low[1:]

    async def _maintain(self) -> None:
        next_trim = 0.0
        while True:
            if self._sink is not None:
                self._sink.flush()
            if time.monotonic() >= next_trim:
                next_trim = time.monotonic() + self.config.trim_period_s
                await self._trim()
            await asyncio.sleep(FLUSH_PERIOD_S)

    async def _trim(self) -> None:
        oldest_ms = int((time.time() - self.config.max_age_s) * 1000)
        try:
            await self.redis.xtrim(self.key, minid=str(oldest_ms), approximate=True)
        except Exception:
            log.warning("audit stream not trimmed by age (Redis unreachable?)", exc_info=True)


def _record(entry_id: str, raw: Mapping[Any, Any]) -> AuditRecord:
    """A stream entry as the API answers it: its id, its time (RFC 3339 ms), then its fields."""
    ms = int(entry_id.partition("-")[0])
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    return {"id": entry_id, "time": at, **{_text(k): _text(v) for k, v in raw.items()}}
