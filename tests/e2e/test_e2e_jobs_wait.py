"""POST /v1/jobs:wait over real HTTP: one long-poll over many jobs, answered when one of them ends."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx

from api.routes_jobs import WAIT_IDS_MAX
from tests.e2e.conftest import KEY_ALICE, KEY_BOB, RunningFleet
from tests.e2e.test_e2e_async import ASYNC, bash, resume, wait_done

PROBLEMS = "https://atefleet.dev/problems/"


def _submit(c: httpx.Client, base: str, command: str) -> str:
    response = c.post(base, json=bash(command), headers=ASYNC)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _wait(c: httpx.Client, ids: list[str], timeout_s: float) -> httpx.Response:
    return c.post("/v1/jobs:wait", json={"ids": ids, "timeout_s": timeout_s})


def test_a_job_ended_before_the_call_is_answered_at_once(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        # given: one ended job and one that will not end soon
        base = resume(c, f"jw-{uuid.uuid4()}")
        ended = _submit(c, base, "echo done")
        wait_done(c, ended)
        slow = _submit(c, resume(c, f"jw-{uuid.uuid4()}"), "sleep 30")
        # when
        response = _wait(c, [slow, ended], 30)
        shown = c.get(f"/v1/jobs/{ended}").json()
        c.post(f"/v1/jobs/{slow}/cancel")
    # then: the ended one, as GET /v1/jobs/{id} shows it
    assert response.status_code == 200, response.text
    assert response.json()["jobs"] == [shown]
    assert shown["state"] == "succeeded"


def test_a_job_ending_during_the_call_wakes_it(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        # given: jobs of two sessions that have not ended yet
        first = _submit(c, resume(c, f"jw-{uuid.uuid4()}"), "sleep 1; echo first")
        second = _submit(c, resume(c, f"jw-{uuid.uuid4()}"), "sleep 60")
        # when: waiting on both
        response = _wait(c, [second, first], 60)
        c.post(f"/v1/jobs/{second}/cancel")
    # then: answered when the first ended, with that one only
    assert response.status_code == 200, response.text
    assert [(j["id"], j["state"]) for j in response.json()["jobs"]] == [(first, "succeeded")]


def test_no_job_ending_within_the_timeout_answers_an_empty_list(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        slow = _submit(c, resume(c, f"jw-{uuid.uuid4()}"), "sleep 30")
        response = _wait(c, [slow], 0.5)
        c.post(f"/v1/jobs/{slow}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"jobs": []}


def test_another_principals_job_or_an_unknown_id_refuses_the_wait(auth_fleet: RunningFleet) -> None:
    with auth_fleet.client(KEY_ALICE) as alice, auth_fleet.client(KEY_BOB) as bob:
        # given: a job of alice's (not ended) and one of bob's
        alices = _submit(alice, resume(alice, f"jw-{uuid.uuid4()}"), "sleep 30")
        bobs = _submit(bob, resume(bob, f"jw-{uuid.uuid4()}"), "sleep 30")
        # when: bob lists alice's job after his own, or an id that never existed
        theirs = _wait(bob, [bobs, alices], 5)
        unknown = _wait(bob, [bobs, "j-unknown"], 5)
        alice.post(f"/v1/jobs/{alices}/cancel")
        bob.post(f"/v1/jobs/{bobs}/cancel")
    # then: 404 naming the first id bob may not see, as GET /v1/jobs/{id} answers it
    for response, bad in ((theirs, alices), (unknown, "j-unknown")):
        assert response.status_code == 404, response.text
        problem = response.json()
        assert problem["type"] == PROBLEMS + "not_found"
        assert (problem["job_id"], problem["index"]) == (bad, 1)


def test_too_many_ids_or_a_malformed_body_is_refused(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        too_many = _wait(c, [f"j-{i}" for i in range(WAIT_IDS_MAX + 1)], 1)
        no_ids = c.post("/v1/jobs:wait", json={"ids": [], "timeout_s": 1})
        bad_timeout = c.post("/v1/jobs:wait", json={"ids": ["j-1"], "timeout_s": "soon"})
    assert too_many.status_code == 413, too_many.text
    assert too_many.json()["type"] == PROBLEMS + "payload_too_large"
    for response, field in ((no_ids, "ids"), (bad_timeout, "timeout_s")):
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["field"] == field


def test_many_concurrent_waits_each_get_their_own_jobs(fleet: RunningFleet) -> None:
    # given: 8 sessions with 5 jobs each, waited for by 8 concurrent callers over every job
    with fleet.client() as c:
        bases = [resume(c, f"jw-{uuid.uuid4()}") for _ in range(8)]
        ids = [_submit(c, base, f"echo {k}") for base in bases for k in range(5)]
    seen: list[list[str]] = []

    def collect() -> None:
        pending, mine = set(ids), []
        with fleet.client() as c:
            while pending:
                response = _wait(c, sorted(pending), 30)
                assert response.status_code == 200, response.text
                jobs: list[dict[str, Any]] = response.json()["jobs"]
                assert all(j["state"] == "succeeded" and j["id"] in pending for j in jobs)
                pending -= {j["id"] for j in jobs}
                mine += [j["id"] for j in jobs]
        seen.append(mine)

    # when
    callers = [threading.Thread(target=collect) for _ in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    # then: every caller saw every job end, once
    assert len(seen) == 8
    assert all(sorted(mine) == sorted(ids) for mine in seen)
