"""Seed 000's curl sequence through the real fleet: same answers; secrets never kept anywhere."""

from __future__ import annotations

import hashlib
import json
import uuid

import httpx

from tests.e2e.conftest import RunningFleet

SECRET = "c3ebfdfdk12345-do-not-keep"


def _call(command: str, call_id: str = "c1", **extra: object) -> dict[str, object]:
    return {
        "call_id": call_id,
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        **extra,
    }


def test_seed_explicit_lifecycle(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    base = f"/v1/environments/my-env/sessions/{sid}"
    with fleet.client() as c:
        # given a new session, when it is resumed, then the seed's answer comes back
        r = c.post(f"{base}/resume")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ok"
        # when a bash call runs with an env var, then its output is the seed's function_call_output
        # (the command proves the value arrived without printing it: the output is kept as a result)
        body = _call('printf %s "$MY_SECRET" | sha256sum | cut -c1-16; uname -s')
        body["env_variables"] = [{"name": "MY_SECRET", "value": SECRET}]
        r = c.post(base, json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["type"] == "function_call_output" and out["call_id"] == "c1" and out["name"] == "bash"
        assert out["output"] == hashlib.sha256(SECRET.encode()).hexdigest()[:16] + "\nLinux\n"
        # when suspended, then ok
        r = c.post(f"{base}/suspend")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ok"
    # then the secret is nowhere in Redis, the logs, or any job's JSON
    db = fleet.redis_client()
    readers = {
        "string": db.get,
        "hash": db.hgetall,
        "list": lambda k: db.lrange(k, 0, -1),
        "stream": db.xrange,
        "zset": lambda k: db.zrange(k, 0, -1),
        "set": db.smembers,
    }
    for key in db.scan_iter(count=1000):
        value = readers.get(db.type(key).decode(), lambda k: b"")(key)
        assert SECRET.encode() not in repr(value).encode(), key
    assert SECRET not in fleet.log()


def test_seed_auto_resume(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    with fleet.client() as c:
        r = c.post(f"/v1/environments/my-env/sessions/{sid}", json={**_call("uname -a"), "auto_resume": True})
        assert r.status_code == 200, r.text
        assert r.json()["output"].startswith("Linux")
        info = c.get(f"/v1/environments/my-env/sessions/{sid}").json()
        assert info["state"] == "suspended"


def test_call_on_suspended_session_without_auto_resume_is_a_clear_conflict(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    with fleet.client() as c:
        r = c.post(f"/v1/environments/my-env/sessions/{sid}", json=_call("true"))
        assert r.status_code == 409
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"].endswith("/session_not_running")


def test_tool_not_allowed_is_answered_like_the_seed(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        body = {"call_id": "x", "type": "function_call", "function": {"name": "edit", "arguments": "{}"}}
        r = c.post("/v1/environments/other-env/sessions/s1", json=body)
        assert r.status_code == 200
        assert r.json()["type"] == "function_call_output" and r.json()["call_id"] == "x"


def test_file_survives_suspend_and_resume(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    base = f"/v1/environments/my-env/sessions/{sid}"
    write = {
        "call_id": "w",
        "type": "function_call",
        "function": {
            "name": "write_file",
            "arguments": json.dumps({"path": "notes/a.txt", "content": "kept"}),
        },
    }
    read = {
        "call_id": "r",
        "type": "function_call",
        "function": {"name": "read_file", "arguments": json.dumps({"path": "notes/a.txt"})},
    }
    with fleet.client() as c:
        assert c.post(f"{base}/resume").status_code == 200
        assert c.post(base, json=write).status_code == 200
        assert c.post(f"{base}/suspend").status_code == 200
        assert c.get(base).json()["snapshot"]["bytes"] > 0  # the local Substrate reports its size
        assert c.post(f"{base}/resume").json()["cold_start"] is False
        assert c.post(base, json=read).json()["output"] == "kept"
        # destroy keeping the snapshot: the state says where it is
        r = c.delete(base, params={"keep_snapshot": "true"})
        assert r.status_code == 200 and r.json()["snapshot_kept"] is True and r.json()["actor"]
        info = c.get(base).json()
        assert info["state"] == "destroyed" and info["snapshot"]["kept"] is True
        assert info["snapshot"]["location"] and info["actor"]["name"] == r.json()["actor"]
        # destroy without keeping: everything is gone, a new resume starts from the template
        assert c.delete(base).json()["snapshot_kept"] is False
        assert c.post(f"{base}/resume").status_code == 200
        gone = c.post(base, json=read).json()
        assert gone.get("is_error") is True


def test_suspend_with_background_processes_is_refused_unless_forced(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    base = f"/v1/environments/my-env/sessions/{sid}"
    bg = {
        "call_id": "bg",
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": "sleep 300", "background": True})},
    }
    with fleet.client() as c:
        assert c.post(f"{base}/resume").status_code == 200
        assert c.post(base, json=bg).status_code == 200
        shown = c.get(base).json()
        assert [p["command"] for p in shown["background_processes"]] == ["sleep 300"]
        refused = c.post(f"{base}/suspend")
        assert refused.status_code == 409
        problem = refused.json()
        assert problem["type"].endswith("/background_processes_running")
        assert problem["processes"][0]["command"] == "sleep 300"
        assert c.post(f"{base}/suspend", params={"force": "true"}).json()["status"] == "ok"
        assert c.get(base).json()["background_processes"] == []


def _suspends(c: httpx.Client) -> float:
    lines = c.get("/metrics").text.splitlines()
    return sum(
        float(x.rsplit(" ", 1)[1])
        for x in lines
        if x.startswith("atefleet_actor_op_seconds_count") and 'op="suspend"' in x
    )


def test_auto_resume_calls_queued_back_to_back_coalesce_their_suspends(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    base = f"/v1/environments/my-env/sessions/{sid}"
    with fleet.client() as c:
        before = _suspends(c)
        ids = [
            c.post(
                base,
                json={**_call(f"echo {i} >> log.txt", f"c{i}"), "auto_resume": True},
                headers={"Prefer": "respond-async"},
            ).json()["id"]
            for i in range(8)
        ]
        for job_id in ids:
            assert c.get(f"/v1/jobs/{job_id}", params={"wait": 60}).json()["state"] == "succeeded"
        # every call ran, in order, and the session ends suspended (seed semantics) ...
        assert c.get(base).json()["state"] == "suspended"
        read = {**_call("cat log.txt"), "auto_resume": True}
        assert c.post(base, json=read).json()["output"].split() == [str(i) for i in range(8)]
        # ... but the suspends between calls that were already queued were skipped
        assert _suspends(c) - before < 8


def test_environments_and_ready_to_use_tool_definitions(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        envs = {e["name"]: e for e in c.get("/v1/environments").json()["environments"]}
        assert set(envs) == {"my-env", "other-env"}
        allowed = envs["my-env"]["allowed_tools"]
        openai = c.get("/v1/environments/my-env/tools", params={"format": "openai"}).json()["tools"]
        assert [t["function"]["name"] for t in openai] == allowed
        assert all(
            t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in openai
        )
        anthropic = c.get("/v1/environments/my-env/tools", params={"format": "anthropic"}).json()["tools"]
        assert [t["name"] for t in anthropic] == allowed
        assert all(t["input_schema"]["type"] == "object" for t in anthropic)
        assert c.get("/v1/environments/nope/tools").status_code == 404
