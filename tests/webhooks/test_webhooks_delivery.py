"""End to end over real HTTP and real Redis: job completion → signed callback, retries, refusal, restart."""

from __future__ import annotations

import asyncio
import json

from webhook_fixtures import SECRET, DelivererFactory, Fleet, Receiver, eventually, make_config

from common.job_json import job_to_json
from common.webhook_signing import verify
from workers.webhooks import serve_deliverer


async def test_completed_job_is_posted_signed_with_the_job_json(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a running deliverer and a job with a callback
    await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    # When the job completes
    await fleet.finish(job_id, {"exit_code": 0, "stdout": "hello\n"})
    # Then the receiver gets one POST that verifies with the Standard Webhooks algorithm
    await receiver.got(1)
    callback = receiver.requests[0]
    verify(SECRET, callback.headers, callback.body)
    assert callback.headers["webhook-id"] == job_id
    assert callback.headers["content-type"] == "application/json"
    # And the body is the job JSON as the API shows it
    envelope = json.loads(callback.body)
    record = await fleet.job(job_id)
    expected = job_to_json(record)
    del expected["webhook_attempts"]
    assert envelope == {"type": "job.completed", "timestamp": expected["finished_at"], "data": expected}
    assert envelope["data"]["result"] == {"exit_code": 0, "stdout": "hello\n"}
    # And the attempt is visible on the job
    (attempt,) = await fleet.attempts(job_id, 1)
    assert attempt["status"] == 204 and attempt["error"] is None and attempt["next_attempt_at"] is None
    assert attempt["duration_ms"] >= 0 and attempt["time"].endswith("Z")
    assert job_to_json(await fleet.job(job_id))["webhook_attempts"] == [attempt]


async def test_a_500_is_retried_with_the_same_id_then_succeeds(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a receiver that fails once
    receiver.answers = ["500 Internal Server Error"]
    await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    # When the job completes
    await fleet.finish(job_id)
    # Then the callback is posted again and succeeds; both attempts are recorded
    await receiver.got(2)
    first, second = receiver.requests
    for callback in (first, second):
        verify(SECRET, callback.headers, callback.body)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == job_id
    assert first.body == second.body
    attempts = await fleet.attempts(job_id, 2)
    assert [a["status"] for a in attempts] == [500, 204]
    assert attempts[0]["error"] == "HTTP 500" and attempts[0]["next_attempt_at"] is not None
    assert attempts[1]["next_attempt_at"] is None
    await fleet.delivery_done(job_id)
    assert len(receiver.requests) == 2


async def test_retries_end_with_the_schedule(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a receiver that always fails and a schedule of three attempts
    receiver.answers = ["503 Service Unavailable"] * 10
    await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    # Then exactly three attempts are made, the last one final
    await fleet.delivery_done(job_id)
    attempts = (await fleet.job(job_id)).webhook_attempts
    assert [a["status"] for a in attempts] == [503, 503, 503]
    assert attempts[-1]["next_attempt_at"] is None
    assert len(receiver.requests) == 3


async def test_410_stops_delivery(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    receiver.answers = ["410 Gone"]
    await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    await fleet.delivery_done(job_id)
    (attempt,) = (await fleet.job(job_id)).webhook_attempts
    assert attempt["status"] == 410 and attempt["next_attempt_at"] is None
    assert len(receiver.requests) == 1


async def test_retry_after_is_honoured(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a schedule whose second slot is far away and a receiver asking to come back at once
    receiver.answers = ["429 Too Many Requests\nretry-after: 0"]
    await start_deliverer(make_config(retry_schedule_s=[0, 600]))
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    # Then the retry follows Retry-After, not the schedule
    await receiver.got(2)
    attempts = await fleet.attempts(job_id, 2)
    assert [a["status"] for a in attempts] == [429, 204]


async def test_refused_address_is_never_contacted(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given private targets are not allowed and a callback to loopback
    await start_deliverer(make_config(allow_private_targets=False))
    job_id = await fleet.submit(receiver.url)
    # When the job completes
    await fleet.finish(job_id)
    # Then the refusal is recorded once, final, and the receiver saw no connection at all
    await fleet.delivery_done(job_id)
    (attempt,) = (await fleet.job(job_id)).webhook_attempts
    assert attempt["status"] is None and attempt["next_attempt_at"] is None
    assert attempt["error"].startswith("target refused") and "loopback" in attempt["error"]
    assert receiver.connections == 0


async def test_unsigned_when_the_job_names_no_secret(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    await start_deliverer()
    job_id = await fleet.submit(receiver.url, secret_id=None)
    await fleet.finish(job_id)
    await receiver.got(1)
    assert "webhook-signature" not in receiver.requests[0].headers
    assert receiver.requests[0].headers["webhook-id"] == job_id


async def test_unknown_secret_id_is_recorded_and_not_sent(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    await start_deliverer()
    job_id = await fleet.submit(receiver.url, secret_id="rotated-away")
    await fleet.finish(job_id)
    await fleet.delivery_done(job_id)
    (attempt,) = (await fleet.job(job_id)).webhook_attempts
    assert attempt["error"] == "unknown callback_secret_id" and attempt["next_attempt_at"] is None
    assert receiver.connections == 0


async def test_completion_while_the_deliverer_is_down_is_delivered_once_after_restart(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a deliverer that ran (its consumer group exists) and was stopped
    deliverer = await start_deliverer()
    await deliverer.stop()
    # When a job completes while it is down, and it starts again
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    await start_deliverer()
    # Then the callback is delivered exactly once
    await receiver.got(1)
    await fleet.delivery_done(job_id)
    assert len(receiver.requests) == 1
    assert len((await fleet.job(job_id)).webhook_attempts) == 1


async def test_a_pending_retry_survives_a_restart(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a first attempt that failed, with the retry due in 1 s
    receiver.answers = ["500 Internal Server Error"]
    deliverer = await start_deliverer(make_config(retry_schedule_s=[0, 1.0]))
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    await fleet.attempts(job_id, 1)
    # When the deliverer stops before the retry and another one starts
    await deliverer.stop()
    await start_deliverer(make_config(retry_schedule_s=[0, 1.0]))
    # Then the retry is made once, and delivery ends
    await fleet.delivery_done(job_id)
    assert [a["status"] for a in (await fleet.job(job_id)).webhook_attempts] == [500, 204]
    assert len(receiver.requests) == 2


async def test_duplicate_events_collapse_into_one_delivery(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a delivered callback
    await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    await fleet.delivery_done(job_id)
    # When the same terminal event is read again (as after a feeder crash before its ack)
    events = fleet.queue.keys.callbacks
    dup_id = await fleet.redis.xadd(events, {"job": job_id, "session": "default-env/s1",
                                            "state": "succeeded", "ts_ms": "0", "cb": "1"})

    async def consumed() -> bool:
        groups = await fleet.redis.xinfo_groups(events)
        webhooks = next(g for g in groups if g["name"] == b"webhooks")
        return bool(webhooks["pending"] == 0 and webhooks["last-delivered-id"] >= dup_id)

    await eventually(consumed)
    # Then nothing is posted again
    assert len(receiver.requests) == 1


async def test_role_entry_point_delivers_until_stopped(
    fleet: Fleet, receiver: Receiver, redis_url: str
) -> None:
    # Given the role's entry point running with a stop event
    stop = asyncio.Event()
    role = asyncio.create_task(serve_deliverer(make_config(), redis_url, stop=stop))
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    # Then it delivers, and returns once stopped
    await receiver.got(1)
    stop.set()
    await asyncio.wait_for(role, 10)
    assert receiver.requests[0].headers["webhook-id"] == job_id


async def test_a_delivery_cut_short_by_a_stop_is_made_again_after_restart(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given a receiver that does not answer the first POST
    receiver.answers = ["hang"]
    deliverer = await start_deliverer()
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    await receiver.got(1)
    # When the deliverer stops while that POST is in flight (grace over), and starts again
    await deliverer.stop(grace_s=0.1)
    assert (await fleet.job(job_id)).webhook_attempts == []
    await start_deliverer()
    # Then the callback is posted again with the same id, and that attempt is the one recorded
    await receiver.got(2)
    (attempt,) = await fleet.attempts(job_id, 1)
    assert attempt["status"] == 204
    assert receiver.requests[0].headers["webhook-id"] == receiver.requests[1].headers["webhook-id"] == job_id


async def test_an_event_read_but_not_acknowledged_before_a_crash_is_delivered(
    fleet: Fleet, receiver: Receiver, start_deliverer: DelivererFactory
) -> None:
    # Given the feeder's consumer read the terminal event and died before acknowledging it
    deliverer = await start_deliverer()
    await deliverer.stop()
    job_id = await fleet.submit(receiver.url)
    await fleet.finish(job_id)
    events = fleet.queue.keys.callbacks
    read = await fleet.redis.xreadgroup("webhooks", "test-deliverer", {events: ">"}, count=100)
    assert read and read[0][1]
    # When the deliverer starts again under the same consumer name
    await start_deliverer()
    # Then its pending entries are handled first: the callback is delivered once
    await receiver.got(1)
    await fleet.delivery_done(job_id)
    assert len(receiver.requests) == 1
    assert (await fleet.redis.xpending(events, "webhooks"))["pending"] == 0
