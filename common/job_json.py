"""The public JSON of a job: what `GET /v1/jobs/{id}` answers and what a webhook's `data` carries.

Keys (issue 7): `id`, `state` (queued | running | succeeded | failed | cancelled), `environment`,
`session` (the client's session id), `principal` (who submitted it: only principals who may read
the job see it, its submitter and admins), `created_at`, `started_at`, `finished_at` (RFC 3339 UTC with
milliseconds, or null), `result` (exactly the body the sync call would have answered, or null),
`error` (problem+json when failed, else null), `webhook_attempts` (one entry per delivery
attempt: `time`, `status`, `error`, `duration_ms`, `next_attempt_at`) and, only on a job whose
output or result was cut to its cap (`jobs.output_max_bytes`, `jobs.result_max_bytes`),
`truncated` (`["output"]`, `["result"]` or both). Internal bookkeeping
(payload, epoch, callback secret id) is never shown.
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Any

from common.queue import JobRecord


def rfc3339(unix_s: float | None) -> str | None:
    """`2026-11-29T20:42:17.123Z` for a unix time in seconds; None stays None.

    What `datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds")` gives (with Z),
    the time rounded to microseconds as datetime rounds it (half to even, on the fraction), in
    less than half its CPU: the date and time of day are built once per second (every job's
    answer carries one to three of these)."""
    if unix_s is None:
        return None
    fraction, whole = math.modf(unix_s)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        micros -= 1_000_000
        whole += 1
    elif micros < 0:
        micros += 1_000_000
        whole -= 1
    return f"{_second(int(whole))}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=256)
def _second(unix_s: int) -> str:
    """`2026-11-29T20:42:17`: the whole second."""
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="seconds").removesuffix("+00:00")


def job_to_json(job: JobRecord) -> dict[str, Any]:
    """The job's public JSON (see the module docstring for the keys)."""
    body: dict[str, Any] = {
        "id": job.id,
        "state": str(job.state),
        "environment": job.environment,
        "session": job.session_id,
        "principal": job.principal,
        "created_at": rfc3339(job.created_at),
        "started_at": rfc3339(job.started_at),
        "finished_at": rfc3339(job.finished_at),
        "result": job.result,
        "error": job.error,
        "webhook_attempts": list(job.webhook_attempts),
    }
    if job.truncated:  # only on jobs whose output or result was cut to its cap
        body["truncated"] = list(job.truncated)
    return body
