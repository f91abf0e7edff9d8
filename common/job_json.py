"""The public JSON of a job: what `GET /v1/jobs/{id}` answers and what a webhook's `data` carries.

Keys (issue 7): `id`, `state` (queued | running | succeeded | failed | cancelled), `environment`,
`session` (the client's session id), `created_at`, `started_at`, `finished_at` (RFC 3339 UTC with
milliseconds, or null), `result` (exactly the body the sync call would have answered, or null),
`error` (problem+json when failed, else null) and `webhook_attempts` (one entry per delivery
attempt: `time`, `status`, `error`, `duration_ms`, `next_attempt_at`). Internal bookkeeping
(payload, principal, epoch, callback secret id) is never shown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from common.queue import JobRecord


def rfc3339(unix_s: float | None) -> str | None:
    """`2026-11-29T20:42:17.123Z` for a unix time in seconds; None stays None."""
    if unix_s is None:
        return None
    moment = datetime.fromtimestamp(unix_s, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_to_json(job: JobRecord) -> dict[str, Any]:
    """The job's public JSON (see the module docstring for the keys)."""
    return {
        "id": job.id,
        "state": str(job.state),
        "environment": job.environment,
        "session": job.session_id,
        "created_at": rfc3339(job.created_at),
        "started_at": rfc3339(job.started_at),
        "finished_at": rfc3339(job.finished_at),
        "result": job.result,
        "error": job.error,
        "webhook_attempts": list(job.webhook_attempts),
    }
