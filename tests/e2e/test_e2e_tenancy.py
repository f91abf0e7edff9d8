"""Tenancy through the fleet as `atefleet up` runs it, auth on: two API-key principals and one JWT
principal on one environment. Every cross-tenant attempt is refused and audited."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest

from common.secret_box import load_key
from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet
from workers.session_identity import local_signing_key

KEY_ANN = "ak_ann_0123456789abcdef0123"
KEY_BEN = "ak_ben_0123456789abcdef0123"
KEY_OPS = "ak_ops_0123456789abcdef0123"
JWT_SECRET = "tenancy-test-secret-of-at-least-32-bytes"
PROBLEMS = "https://atefleet.dev/problems/"


def _bash(command: str, **extra: Any) -> dict[str, Any]:
    return {
        "call_id": "c",
        "type": "function_call",
        "auto_resume": True,
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        **extra,
    }


def _key(name: str, key: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "sha256": hashlib.sha256(key.encode()).hexdigest(),
        "environments": ["my-env"],
        **extra,
    }


@pytest.fixture(scope="module")
def tenancy_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    tmp = tmp_path_factory.mktemp("tenancy-fleet")
    secret = tmp / "jwt.secret"
    secret.write_text(JWT_SECRET)
    cfg = base_config(
        tmp,
        free_port(),
        auth={
            "api_keys": [_key("ann", KEY_ANN), _key("ben", KEY_BEN), _key("ops", KEY_OPS, admin=True)],
            "jwt": {"hs256_secret_file": str(secret)},
        },
        audit={"jsonl": str(tmp / "audit.jsonl")},
    )
    cfg["environments"][0]["policy"] = {
        "rules": [{"effect": "deny", "tool": "bash", "match": {"command": r"rm\s+-rf\s+/(\s|$)"}}]
    }
    cfg["webhooks"]["secret_principals"] = {"test": ["key:ann"]}
    running = start_fleet(tmp, cfg)
    yield running
    running.stop()


def _carol_token() -> str:
    claims = {"sub": "carol", "envs": ["my-env"], "exp": int(time.time()) + 3600}
    return jwt.encode(claims, JWT_SECRET, algorithm="HS256")


def _refused(r: httpx.Response, status: int, slug: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEMS + slug


def test_every_cross_tenant_attempt_is_refused_and_audited(tenancy_fleet: RunningFleet) -> None:
    with (
        tenancy_fleet.client(KEY_ANN) as ann,
        tenancy_fleet.client(KEY_BEN) as ben,
        tenancy_fleet.client(_carol_token()) as carol,
        tenancy_fleet.client(KEY_OPS) as ops,
    ):
        # Given ann's session, with a file in its workspace, and carol's (JWT) session
        r = ann.post(
            "/v1/environments/my-env/sessions/ann-1", json=_bash("echo ann-secret > notes.txt; echo ok")
        )
        assert r.status_code == 200, r.text
        async_job = ann.post(
            "/v1/environments/my-env/sessions/ann-1",
            json=_bash("sleep 0.2; echo later"),
            headers={"Prefer": "respond-async"},
        ).json()
        assert async_job["principal"] == "key:ann"
        assert (
            carol.post("/v1/environments/my-env/sessions/carol-1", json=_bash("echo hi")).status_code == 200
        )

        # When ben (API key) and carol (JWT) try everything on ann's session, then it does not exist
        hook = {"callback_url": "http://127.0.0.1:9/hook", "callback_secret_id": "test"}
        for intruder, who in ((ben, "key:ben"), (carol, "jwt:carol")):
            attempts = [
                intruder.post("/v1/environments/my-env/sessions/ann-1", json=_bash("cat notes.txt")),
                intruder.post("/v1/environments/my-env/sessions/ann-1/resume"),
                intruder.post("/v1/environments/my-env/sessions/ann-1/suspend"),
                intruder.delete("/v1/environments/my-env/sessions/ann-1"),
                intruder.get("/v1/environments/my-env/sessions/ann-1"),
                intruder.get(f"/v1/jobs/{async_job['id']}"),
                intruder.get(f"/v1/jobs/{async_job['id']}/events"),
                intruder.post(f"/v1/jobs/{async_job['id']}/cancel"),
                intruder.post(
                    "/v1/jobs:batch",
                    json={"calls": [{"environment": "my-env", "session": "ann-1", **_bash("cat notes.txt")}]},
                ),
            ]
            for attempt in attempts:
                _refused(attempt, 404, "not_found")
            listed = intruder.get("/v1/environments/my-env/sessions").json()["sessions"]
            assert "ann-1" not in [s["session"] for s in listed]
            _refused(
                intruder.post("/v1/environments/my-env/sessions/x-1", json=_bash("echo", **hook)),
                403,
                "callback_secret_forbidden",
            )
            _refused(intruder.get("/v1/audit"), 403, "forbidden")
            denials = ops.get("/v1/audit", params={"principal": who, "session": "ann-1"}).json()["records"]
            assert [d["ev"] for d in denials] == ["ownership_denied"] * len(attempts)

        # ... and ann's session is untouched: her file is there, her async job ran
        assert ann.get(f"/v1/jobs/{async_job['id']}?wait=30").json()["state"] == "succeeded"
        r = ann.post("/v1/environments/my-env/sessions/ann-1", json=_bash("cat notes.txt"))
        assert "ann-secret" in r.json()["output"]
        # Policy: refused before it runs, naming the rule, audited
        _refused(
            ann.post("/v1/environments/my-env/sessions/ann-1", json=_bash("rm -rf /")), 403, "policy_denied"
        )
        # The admin sees every session and acts on them
        listed = ops.get("/v1/environments/my-env/sessions").json()["sessions"]
        assert {("ann-1", "key:ann"), ("carol-1", "jwt:carol")} <= {
            (s["session"], s["owner"]) for s in listed
        }
        assert ops.get(f"/v1/jobs/{async_job['id']}").status_code == 200
        # The audit log has ann's calls (with a digest, never values) and every refusal
        records = ops.get("/v1/audit", params={"limit": 1000}).json()["records"]
        calls = [x for x in records if x["ev"] == "call" and x["pr"] == "key:ann"]
        assert len(calls) == 3 and all(len(x["digest"]) == 40 for x in calls)
        assert [x["why"] for x in records if x["ev"] == "policy_denied"] == ["environments.0.policy.rules.0"]
        assert len([x for x in records if x["ev"] == "callback_secret_denied"]) == 2
        assert not any("ann-secret" in json.dumps(x) for x in records)
    # ... and the JSON lines file has the refusals too
    lines = [json.loads(x) for x in (tenancy_fleet.state_dir.parent / "audit.jsonl").read_text().splitlines()]
    assert len([x for x in lines if x["ev"] == "ownership_denied"]) == 18


def test_each_resume_gives_the_session_a_signed_identity(tenancy_fleet: RunningFleet) -> None:
    key = local_signing_key(load_key(tenancy_fleet.state_dir))
    show = ('printf "%s\\n" "$ATEFLEET_SESSION_TOKEN"; cat "$ATEFLEET_SESSION_TOKEN_FILE"; echo; '
            'ls -l "$ATEFLEET_SESSION_TOKEN_FILE"')
    with tenancy_fleet.client(KEY_ANN) as ann, tenancy_fleet.client(_carol_token()) as carol:
        tokens = []
        for client, sid in ((ann, "ann-id"), (ann, "ann-id"), (carol, "carol-id")):
            # auto_resume: each call resumes the actor (a new incarnation), then parks it again
            out = client.post(f"/v1/environments/my-env/sessions/{sid}", json=_bash(show)).json()["output"]
            env_token, file_token, listing = out.strip().splitlines()[:3]
            assert env_token == file_token and listing.startswith("-rw-------")
            tokens.append(jwt.decode(env_token, key, algorithms=["HS256"], audience="atefleet-session"))
    (first, second, carols) = tokens
    assert (first["sub"], first["principal"]) == ("my-env/ann-id", "key:ann")
    # the same (sub, principal); whether the same token too depends on which worker process ran
    # each call: tests/substrate/test_substrate_identity.py has a process keep it across resumes
    assert (second["sub"], second["principal"]) == (first["sub"], first["principal"])
    assert (carols["sub"], carols["principal"]) == ("my-env/carol-id", "jwt:carol")
