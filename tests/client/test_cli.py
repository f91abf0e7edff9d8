"""The `atefleet` CLI's client commands end to end: real processes against the real fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from atefleet.client import Client, tool_item
from tests.client.conftest import RunningFleet


def atefleet(fleet: RunningFleet, *args: str, stdin: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ATEFLEET_API_URL": fleet.url}
    env.pop("ATEFLEET_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "atefleet", *args], env=env, input=stdin, text=True,
                          capture_output=True, timeout=180)
    if check and done.returncode != 0:
        raise AssertionError(f"atefleet {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def as_json(fleet: RunningFleet, *args: str) -> Any:
    return json.loads(atefleet(fleet, *args, "--json").stdout)


@pytest.fixture
def sid() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


def test_exec_streams_and_exits_with_the_commands_code(fleet: RunningFleet, sid: str) -> None:
    # Given a session that does not exist yet, exec resumes it, streams output, and exits with the code
    done = atefleet(fleet, "exec", "my-env", sid, "--", "echo out; echo err >&2; exit 7", check=False)
    assert (done.returncode, done.stdout) == (7, "out\n")
    assert "err" in done.stderr
    lines = [json.loads(line) for line in atefleet(fleet, "exec", "my-env", sid, "--json", "--", "echo j")
             .stdout.splitlines()]
    assert lines[0] == {"event": "output", "stream": "stdout", "data": "j\n"}
    assert lines[-1]["event"] == "result" and lines[-1]["state"] == "succeeded"


def test_lifecycle_sessions_and_call(fleet: RunningFleet, sid: str) -> None:
    assert as_json(fleet, "resume", "my-env", sid)["status"] == "ok"
    assert as_json(fleet, "sessions", "show", "my-env", sid)["state"] == "running"
    assert sid in atefleet(fleet, "sessions", "ls", "my-env").stdout
    assert sid in [s["session"] for s in as_json(fleet, "sessions", "ls", "my-env")]
    assert "my-env" in [e["name"] for e in as_json(fleet, "sessions")]
    assert atefleet(fleet, "call", "my-env", sid, "write_file", '{"path": "f", "content": "hi"}')
    assert as_json(fleet, "call", "my-env", sid, "read_file", '{"path": "f"}')["output"] == "hi"
    missing = atefleet(fleet, "call", "my-env", sid, "read_file", '{"path": "missing"}', check=False)
    assert missing.returncode == 1
    atefleet(fleet, "call", "my-env", sid, "bash", '{"command": "sleep 30", "background": true}')
    refused = atefleet(fleet, "suspend", "my-env", sid, check=False)
    assert refused.returncode == 1 and "409" in refused.stderr
    assert as_json(fleet, "suspend", "my-env", sid, "--force")["status"] == "ok"
    assert as_json(fleet, "destroy", "my-env", sid)["status"] == "ok"


def test_lifecycle_verbs_under_sessions(fleet: RunningFleet, sid: str) -> None:
    # Given the lifecycle verbs under `sessions` (the top-level `atefleet suspend` is README's
    # older spelling, tested above), with options before or after the verb
    assert as_json(fleet, "sessions", "resume", "my-env", sid)["status"] == "ok"
    assert as_json(fleet, "sessions", "suspend", "my-env", sid, "--force")["status"] == "ok"
    shown = json.loads(atefleet(fleet, "sessions", "--json", "show", "my-env", sid).stdout)
    assert shown["state"] == "suspended"
    assert as_json(fleet, "sessions", "destroy", "my-env", sid, "--keep-snapshot")["status"] == "ok"
    # a noun without its verb is a usage error
    assert atefleet(fleet, "jobs", check=False).returncode == 2


def test_cp_up_and_down_binary_safe_in_parts(fleet: RunningFleet, sid: str, tmp_path: Path) -> None:
    as_json(fleet, "resume", "my-env", sid)
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(bytes(range(256)) * 4)
    big.write_bytes(os.urandom((4 << 20) + 12345))  # more than one part each way
    for local in (small, big):
        up = as_json(fleet, "cp", str(local), f"my-env/{sid}:in/{local.name}")
        assert up["bytes"] == local.stat().st_size
        back = tmp_path / f"back-{local.name}"
        atefleet(fleet, "cp", f"my-env/{sid}:in/{local.name}", str(back))
        assert back.read_bytes() == local.read_bytes()
    listing = as_json(fleet, "call", "my-env", sid, "list_dir", '{"path": "in"}')["output"]
    assert "atefleet-cp" not in listing  # the parts were joined and removed
    bad = atefleet(fleet, "cp", str(small), str(tmp_path / "x"), check=False)
    assert bad.returncode != 0 and "ENV/SID:PATH" in bad.stderr


def test_jobs_show_wait_cancel_tail(fleet: RunningFleet, sid: str) -> None:
    with Client(fleet.url) as client:
        session = client.session("my-env", sid, auto_resume=True)
        job = session.submit("bash", {"command": "echo tail-me"})
        slow = session.submit("bash", {"command": "sleep 60"})
    assert "tail-me" in atefleet(fleet, "jobs", "tail", job.id).stdout
    assert as_json(fleet, "jobs", "wait", job.id)["state"] == "succeeded"
    assert as_json(fleet, "jobs", "show", job.id)["result"]["output"] == "tail-me\n"
    assert job.id in atefleet(fleet, "jobs", "show", job.id).stdout
    as_json(fleet, "jobs", "cancel", slow.id)
    assert as_json(fleet, "jobs", "wait", slow.id)["state"] == "cancelled"
    missing = atefleet(fleet, "jobs", "show", "ffffffffff0-nope", check=False)
    assert missing.returncode == 1 and "404" in missing.stderr


def test_batch_from_json_lines(fleet: RunningFleet, sid: str, tmp_path: Path) -> None:
    lines = "\n".join(json.dumps({"environment": "my-env", "session": sid, "auto_resume": True,
                                  **tool_item("bash", {"command": f"echo {i}"})}) for i in range(3))
    jobs = json.loads(atefleet(fleet, "batch", "-", "--wait", "--json", stdin=lines).stdout)
    assert sorted(j["result"]["output"] for j in jobs) == ["0\n", "1\n", "2\n"]
    (tmp_path / "calls.jsonl").write_text(lines + "\n")
    assert len(as_json(fleet, "batch", str(tmp_path / "calls.jsonl"))) == 3


def test_tools_capacity_audit_and_completion(fleet: RunningFleet) -> None:
    names = {t["function"]["name"] for t in as_json(fleet, "tools", "my-env")}
    assert "bash" in names
    assert {t["name"] for t in as_json(fleet, "tools", "my-env", "--format", "anthropic")} == names
    assert "read_file" in atefleet(fleet, "tools", "my-env").stdout
    assert isinstance(as_json(fleet, "capacity"), dict)
    as_json(fleet, "audit")  # each read of the audit log is audited: 2 records after the next
    first_two = as_json(fleet, "audit", "--limit", "2")
    assert len(first_two) == 2 and as_json(fleet, "audit", "--limit", "1000")[:2] == first_two
    assert len(as_json(fleet, "audit", "--limit", "1")) == 1
    assert "complete" in atefleet(fleet, "completion", "bash").stdout
    unreachable = subprocess.run([sys.executable, "-m", "atefleet", "tools", "my-env", "--api-url",
                                  "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
