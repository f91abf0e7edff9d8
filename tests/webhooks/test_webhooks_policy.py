"""Pure delivery policy: retry planning, Retry-After, the callback body and the job JSON."""

from __future__ import annotations

import json
from email.utils import formatdate

import pytest

from common.config import WebhookConfig
from common.job_json import job_to_json, rfc3339
from common.queue import JobKind, JobRecord, JobState
from workers.webhook_sender import (
    AttemptOutcome,
    WebhookSender,
    next_delay_s,
    parse_retry_after,
    webhook_body,
)
from workers.webhook_target import make_client
from workers.webhooks import delivery_finished

SCHEDULE = (0.0, 5.0, 300.0, 1800.0)


def outcome(status: int | None, final: bool = False, retry_after_s: float | None = None) -> AttemptOutcome:
    return AttemptOutcome(status, None, 3, final, retry_after_s)


def job(**changes: object) -> JobRecord:
    record = JobRecord(
        id="j-1", environment="env", session_id="s/1", kind=JobKind.TOOL, state=JobState.SUCCEEDED,
        payload={"tool": "bash"}, principal="p", callback_url="https://example.com/hook",
        callback_secret_id="main", attempts=1, epoch=3, created_at=1700000000.0,
        started_at=1700000000.25, finished_at=1700000001.5, result={"exit_code": 0}, error=None,
        cancel_requested=False, webhook_attempts=[],
    )
    for key, value in changes.items():
        setattr(record, key, value)
    return record


@pytest.mark.parametrize(
    ("attempts_made", "expected"),
    [(1, 5.0), (2, 300.0), (3, 1800.0), (4, None)],
)
def test_failures_follow_the_schedule_until_it_ends(attempts_made: int, expected: float | None) -> None:
    assert next_delay_s(SCHEDULE, attempts_made, outcome(500)) == expected


def test_final_outcomes_are_never_retried() -> None:
    assert next_delay_s(SCHEDULE, 1, outcome(200, final=True)) is None
    assert next_delay_s(SCHEDULE, 1, outcome(410, final=True)) is None


def test_retry_after_replaces_the_scheduled_delay_within_bounds() -> None:
    assert next_delay_s(SCHEDULE, 1, outcome(503, retry_after_s=42)) == 42
    assert next_delay_s(SCHEDULE, 1, outcome(503, retry_after_s=10**9)) == 1800.0
    assert next_delay_s(SCHEDULE, 1, outcome(503, retry_after_s=-5)) == 0.0
    assert next_delay_s(SCHEDULE, 4, outcome(503, retry_after_s=1)) is None


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now) == pytest.approx(30)
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_job_json_has_exactly_the_issue_keys_in_rfc3339() -> None:
    data = job_to_json(job(webhook_attempts=[{"time": "t", "status": 500}]))
    assert data == {
        "id": "j-1",
        "state": "succeeded",
        "environment": "env",
        "session": "s/1",
        "principal": "p",
        "created_at": "2023-11-14T22:13:20.000Z",
        "started_at": "2023-11-14T22:13:20.250Z",
        "finished_at": "2023-11-14T22:13:21.500Z",
        "result": {"exit_code": 0},
        "error": None,
        "webhook_attempts": [{"time": "t", "status": 500}],
    }
    assert rfc3339(None) is None


def test_body_is_the_job_json_and_stays_the_same_across_attempts() -> None:
    first = webhook_body(job())
    later = webhook_body(job(webhook_attempts=[{"time": "t", "status": 500, "next_attempt_at": "x"}]))
    assert first == later
    envelope = json.loads(first)
    assert envelope["type"] == "job.completed"
    assert envelope["timestamp"] == "2023-11-14T22:13:21.500Z"
    assert envelope["data"]["id"] == "j-1" and "webhook_attempts" not in envelope["data"]


def test_delivery_is_finished_when_the_last_attempt_planned_none() -> None:
    assert not delivery_finished(job())
    assert not delivery_finished(job(webhook_attempts=[{"next_attempt_at": "2023-11-14T22:13:26.500Z"}]))
    assert delivery_finished(job(webhook_attempts=[{"status": 200, "next_attempt_at": None}]))


async def test_a_malformed_signing_secret_ends_delivery_without_sending() -> None:
    config = WebhookConfig(secrets={"bad": "whsec_not base64!"})
    async with make_client(config) as client:
        # The URL is never reached: signing fails before any connection
        outcome = await WebhookSender(config, client).post(job(callback_secret_id="bad"), "http://192.0.2.1/")
    assert outcome.final and outcome.status is None
    assert outcome.error == "signing secret is not whsec_ + base64"
