"""Auth over real HTTP: wrong token 401, other environment 403, another principal's job 404."""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import AUTH_FLEET_JOB_TTL_S, AUTH_FLEET_SYNC_WAIT_S, KEY_ALICE, KEY_BOB, RunningFleet

CALL = {
    "call_id": "a",
    "type": "function_call",
    "function": {"name": "bash", "arguments": json.dumps({"command": "echo hi"})},
    "auto_resume": True,
}


def test_wrong_or_missing_token_is_401(auth_fleet: RunningFleet) -> None:
    for token in (None, "not-a-key"):
        with auth_fleet.client(token) as c:
            # a FastAPI route, and the session's tool call and view (served by api/hot_path.py)
            for r in (c.post("/v1/environments/my-env/sessions/s1/resume"),
                      c.post("/v1/environments/my-env/sessions/s1", json=CALL),
                      c.get("/v1/environments/my-env/sessions/s1")):
                assert r.status_code == 401, r.request
                assert r.headers["www-authenticate"].lower().startswith("bearer")
                assert r.headers["content-type"].startswith("application/problem+json")


def test_other_environment_is_403(auth_fleet: RunningFleet) -> None:
    with auth_fleet.client(KEY_ALICE) as c:
        r = c.post("/v1/environments/other-env/sessions/s1", json=CALL)
        assert r.status_code == 403
        r = c.get("/v1/environments/other-env/sessions/s1")
        assert r.status_code == 403


def test_other_principals_job_is_404(auth_fleet: RunningFleet) -> None:
    with auth_fleet.client(KEY_ALICE) as alice, auth_fleet.client(KEY_BOB) as bob:
        r = alice.post(
            "/v1/environments/my-env/sessions/alice-1", json=CALL, headers={"Prefer": "respond-async"}
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        assert alice.get(f"/v1/jobs/{job_id}?wait=30").json()["state"] == "succeeded"
        assert bob.get(f"/v1/jobs/{job_id}").status_code == 404
        assert bob.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
        assert bob.get(f"/v1/jobs/{job_id}/events").status_code == 404


def test_expired_job_is_404_with_a_clear_type(auth_fleet: RunningFleet) -> None:
    with auth_fleet.client(KEY_ALICE) as alice:
        r = alice.post(
            "/v1/environments/my-env/sessions/alice-exp", json=CALL, headers={"Prefer": "respond-async"}
        )
        job_id = r.json()["id"]
        assert alice.get(f"/v1/jobs/{job_id}?wait=30").json()["state"] == "succeeded"
        deadline = time.monotonic() + AUTH_FLEET_JOB_TTL_S + 10
        while (gone := alice.get(f"/v1/jobs/{job_id}")).status_code == 200:
            assert time.monotonic() < deadline, "the job outlived its TTL"
            time.sleep(0.25)
        assert gone.status_code == 404
        assert gone.json()["type"].endswith("/job_expired")
        unknown = alice.get("/v1/jobs/never-was-a-job")
        assert unknown.status_code == 404 and unknown.json()["type"].endswith("/not_found")


def test_a_sync_call_outliving_the_wait_limit_answers_202_with_its_location(auth_fleet: RunningFleet) -> None:
    slow = {**CALL, "function": {"name": "bash", "arguments": json.dumps({"command": "sleep 4; echo late"})}}
    with auth_fleet.client(KEY_ALICE) as alice:
        started = time.monotonic()
        r = alice.post("/v1/environments/my-env/sessions/alice-slow", json=slow)
        assert r.status_code == 202, r.text
        assert AUTH_FLEET_SYNC_WAIT_S <= time.monotonic() - started < AUTH_FLEET_SYNC_WAIT_S + 3
        assert r.json()["state"] == "running"  # the job as it is at the limit, not as it was enqueued
        done = alice.get(r.headers["location"], params={"wait": 30}).json()
        assert done["state"] == "succeeded" and done["result"]["output"] == "late\n"
