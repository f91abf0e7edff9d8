"""A fleet for the operator UI and the DLQ API: auth on (an admin key and a tenant key) and one
attempt per job, so a call whose resume meets a stalled Substrate is dead-lettered at once (and
succeeds when replayed once Substrate answers again)."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.e2e.conftest import RunningFleet, base_config, free_port, start_fleet

KEY_ADMIN = "ak_ui_admin_0123456789abcdef"
KEY_TENANT = "ak_ui_tenant_0123456789abcdef"
ENV = "my-env"

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60) -> T:
    """Poll `probe` until it answers something truthy (the fleet is another process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def ui_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    tmp: Path = tmp_path_factory.mktemp("ui-fleet")
    keys = [{"name": "admin", "sha256": hashlib.sha256(KEY_ADMIN.encode()).hexdigest(),
             "environments": ["*"], "admin": True},
            {"name": "tenant", "sha256": hashlib.sha256(KEY_TENANT.encode()).hexdigest(),
             "environments": [ENV]}]
    cfg = base_config(tmp, free_port(), auth={"api_keys": keys})
    cfg["workers"] = {"processes": 1, "concurrency": 16, "lease_ttl_s": 3, "max_attempts": 1}
    running = start_fleet(tmp, cfg)
    yield running
    running.stop()


@pytest.fixture
def admin(ui_fleet: RunningFleet) -> Iterator[httpx.Client]:
    with ui_fleet.client(KEY_ADMIN) as client:
        yield client


def _substrate_pid(fleet: RunningFleet) -> int:
    """The pid of this fleet's local Substrate (a child of its `atefleet up`)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == fleet.process.pid and b"local-substrate" in cmdline:
            return int(status.parent.name)
    raise AssertionError("the fleet's local Substrate process was not found")


@contextmanager
def substrate_stalled(fleet: RunningFleet) -> Iterator[None]:
    """Substrate stops answering (SIGSTOP) until the block ends: its calls hit their deadline."""
    pid = _substrate_pid(fleet)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def dead_letter(client: httpx.Client, fleet: RunningFleet, session: str, command: str) -> dict[str, Any]:
    """Dead-letter a call: Substrate stalls, so the call's resume hits its deadline, a retryable
    failure, on the job's one attempt. Returns the failed job's JSON (Substrate answers again)."""
    with substrate_stalled(fleet):
        sent = client.post(f"/v1/environments/{ENV}/sessions/{session}",
                           headers={"Prefer": "respond-async"},
                           json={"type": "function_call", "call_id": "c1", "name": "bash",
                                 "auto_resume": True, "arguments": {"command": command}})
        assert sent.status_code == 202, sent.text
        job_id = sent.json()["id"]
        return wait_for("the call to fail", lambda: _ended(client, job_id))


def _ended(client: httpx.Client, job_id: str) -> dict[str, Any] | None:
    job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
    return job if job["state"] in ("succeeded", "failed", "cancelled") else None
