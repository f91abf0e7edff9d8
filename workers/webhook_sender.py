"""One webhook attempt: the signed request, the answer's classification, and the retry policy.

`WebhookSender.post` builds the body (the job JSON in a Standard Webhooks envelope, the same bytes
on every attempt), signs it with the job's secret, POSTs it through the guarded client
(workers/webhook_target.py) within the configured timeout, and turns whatever happens into an
`AttemptOutcome`; it never raises. `next_delay_s` decides from that outcome and the schedule
whether and when to try again.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import httpx

from common.config import WebhookConfig
from common.job_json import job_to_json, rfc3339
from common.logs import redact
from common.queue import JobRecord
from common.webhook_signing import sign
from workers.webhook_target import TargetRefused

#: Event type of every callback (the job's `state` tells how it ended).
EVENT_TYPE = "job.completed"

#: Answer bodies up to this size are read (and dropped) to keep the connection; only status matters.
MAX_ANSWER_BODY_BYTES = 64 << 10


@dataclass(frozen=True)
class AttemptOutcome:
    """What one POST came to."""

    status: int | None
    error: str | None
    duration_ms: int
    #: No retry whatever the schedule says (delivered, 410, refused target, unknown secret).
    final: bool
    retry_after_s: float | None = None


def next_delay_s(schedule: tuple[float, ...], attempts_made: int, outcome: AttemptOutcome) -> float | None:
    """Seconds until the next attempt, or None when delivery ends here."""
    if outcome.final or attempts_made >= len(schedule):
        return None
    if outcome.retry_after_s is not None:
        return min(max(outcome.retry_after_s, 0.0), max(schedule))
    return schedule[attempts_made]


def parse_retry_after(value: str | None, now_s: float) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None if absent or invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return parsedate_to_datetime(value).timestamp() - now_s
    except (TypeError, ValueError):
        return None


def webhook_body(job: JobRecord) -> bytes:
    """The callback body: the same bytes on every attempt (attempts are left out, they grow)."""
    data = job_to_json(job)
    del data["webhook_attempts"]
    envelope = {"type": EVENT_TYPE, "timestamp": rfc3339(job.finished_at), "data": data}
    return json.dumps(envelope, separators=(",", ":")).encode()


class WebhookSender:
    """Makes one signed POST of a job's callback and classifies the answer."""

    def __init__(self, config: WebhookConfig, client: httpx.AsyncClient) -> None:
        self._config = config
        self._client = client

    async def post(self, job: JobRecord, url: str) -> AttemptOutcome:
        started = time.monotonic()
        body = webhook_body(job)
        try:
            headers = self._headers(job, body)
        except KeyError:
            return AttemptOutcome(None, "unknown callback_secret_id", 0, final=True)
        except ValueError:
            return AttemptOutcome(None, "signing secret is not whsec_ + base64", 0, final=True)
        try:
            status, retry_after = await self._send(url, body, headers)
        except httpx.InvalidURL as err:
            return AttemptOutcome(None, f"invalid callback URL: {err}", _ms_since(started), final=True)
        except TargetRefused as err:
            return AttemptOutcome(None, f"target refused: {err}", _ms_since(started), final=True)
        except (httpx.HTTPError, TimeoutError) as err:
            return AttemptOutcome(None, self._describe(err), _ms_since(started), final=False)
        ok = 200 <= status < 300
        return AttemptOutcome(status, None if ok else f"HTTP {status}", _ms_since(started),
                              final=ok or status == 410, retry_after_s=retry_after)

    def _headers(self, job: JobRecord, body: bytes) -> dict[str, str]:
        """Standard Webhooks headers.

        Raises KeyError when the job names a secret the config lacks, ValueError when that secret
        is malformed: both are final (retrying cannot fix the configuration of this job).
        """
        now = int(time.time())
        headers = {"content-type": "application/json", "webhook-id": job.id, "webhook-timestamp": str(now)}
        if job.callback_secret_id is not None:
            secret = self._config.secrets[job.callback_secret_id]
            headers["webhook-signature"] = sign(secret, job.id, now, body)
        return headers

    async def _send(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, float | None]:
        # httpx's timeout is per connect/read/write; this bounds the whole exchange (slow-drip receivers).
        async with asyncio.timeout(self._config.timeout_s):
            request = self._client.build_request("POST", url, content=body, headers=headers)
            response = await self._client.send(request, stream=True)
            try:
                await _discard_body(response)
            finally:
                await response.aclose()
        return response.status_code, parse_retry_after(response.headers.get("retry-after"), time.time())

    def _describe(self, err: Exception) -> str:
        if isinstance(err, TimeoutError | httpx.TimeoutException):
            return f"timed out after {self._config.timeout_s:g} s"
        detail = redact(str(err))
        return f"{type(err).__name__}: {detail}" if detail else type(err).__name__


async def _discard_body(response: httpx.Response) -> None:
    """Read and drop a small answer body, so its connection can be reused; stop at a large one."""
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        if received > MAX_ANSWER_BODY_BYTES:
            return  # closing mid-body discards the connection instead


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
