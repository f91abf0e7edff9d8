"""`/v1/dlq…` and `atefleet dlq` through the real fleet: a job dead-lettered by a stalled Substrate,
listed, inspected, replayed (it then succeeds, same job id) and discarded; admins only; bad ids
refused."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx

from tests.e2e.conftest import RunningFleet
from tests.ui.conftest import KEY_ADMIN, KEY_TENANT, dead_letter, wait_for


def _entry_of(client: httpx.Client, job_id: str) -> dict[str, Any] | None:
    entries = client.get("/v1/dlq", params={"limit": 1000}).json()["entries"]
    return next((e for e in entries if e["job_id"] == job_id), None)


def _audited(client: httpx.Client, sid: str, op: str, job_id: str) -> bool:
    records = client.get("/v1/audit", params={"session": sid, "limit": 1000}).json()["records"]
    return any(r.get("ev") == "admin" and r.get("op") == op and r.get("job") == job_id
               and r.get("pr") == "key:admin" for r in records)


def test_a_dead_lettered_job_is_listed_inspected_and_replayed_to_success(
        ui_fleet: RunningFleet, admin: httpx.Client) -> None:
    # given a call that failed on its only attempt (Substrate did not answer)
    failed = dead_letter(admin, ui_fleet, "dlq-victim", "echo replayed")
    assert failed["state"] == "failed"
    assert failed["error"]["type"].endswith("retries_exhausted")
    entry = wait_for("the DLQ entry", lambda: _entry_of(admin, failed["id"]))
    assert entry["session"] == "dlq-victim" and entry["attempts"] == 1
    shown = admin.get(f"/v1/dlq/{entry['id']}").json()
    assert shown["job"]["id"] == failed["id"] and shown["job"]["state"] == "failed"

    # when the entry is replayed (Substrate answers again)
    replayed = admin.post(f"/v1/dlq/{entry['id']}/replay")

    # then the same job runs again and succeeds, and the entry is gone
    assert replayed.status_code == 202, replayed.text
    assert replayed.json()["id"] == failed["id"]
    done = admin.get(f"/v1/jobs/{failed['id']}", params={"wait": 60}).json()
    assert done["state"] == "succeeded", done
    assert "replayed" in done["result"]["output"]
    assert admin.get(f"/v1/dlq/{entry['id']}").status_code == 404
    assert _audited(admin, "dlq-victim", "dlq_replay", failed["id"])
    again = admin.post(f"/v1/dlq/{entry['id']}/replay")
    assert again.status_code == 404 and again.headers["content-type"] == "application/problem+json"


def test_discard_drops_the_entry_and_keeps_the_failed_job(
        ui_fleet: RunningFleet, admin: httpx.Client) -> None:
    failed = dead_letter(admin, ui_fleet, "dlq-victim2", "echo never")
    entry = wait_for("the DLQ entry", lambda: _entry_of(admin, failed["id"]))

    assert admin.delete(f"/v1/dlq/{entry['id']}").status_code == 204

    assert admin.get(f"/v1/dlq/{entry['id']}").status_code == 404
    assert admin.delete(f"/v1/dlq/{entry['id']}").status_code == 404
    assert admin.get(f"/v1/jobs/{failed['id']}").json()["state"] == "failed"
    assert _audited(admin, "dlq-victim2", "dlq_discard", failed["id"])


def test_only_admins_reach_the_dlq(ui_fleet: RunningFleet) -> None:
    with ui_fleet.client(KEY_TENANT) as tenant, ui_fleet.client() as nobody:
        for method, path in [("GET", "/v1/dlq"), ("GET", "/v1/dlq/1-0"), ("POST", "/v1/dlq/1-0/replay"),
                             ("DELETE", "/v1/dlq/1-0")]:
            assert tenant.request(method, path).status_code == 403, path
            assert nobody.request(method, path).status_code == 401, path


def test_malformed_entry_ids_and_cursors_are_refused(admin: httpx.Client) -> None:
    for bad in ["abc", "1-", "-1", "1-0-0", "9" * 60 + "-0", "$", "+", "1-0 OR 1"]:
        for method, path in [("GET", f"/v1/dlq/{bad}"), ("POST", f"/v1/dlq/{bad}/replay"),
                             ("DELETE", f"/v1/dlq/{bad}")]:
            answer = admin.request(method, path)
            assert answer.status_code in (400, 404), (bad, method, answer.status_code)
            assert answer.headers["content-type"] == "application/problem+json"
        assert admin.get("/v1/dlq", params={"cursor": bad}).status_code == 400
    assert admin.get("/v1/dlq", params={"limit": 0}).status_code == 422


def _cli(fleet: RunningFleet, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "atefleet", *args, "--json", "--api-url", fleet.url,
                           "--token", KEY_ADMIN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_cli_lists_shows_and_replays_a_dead_letter(ui_fleet: RunningFleet, admin: httpx.Client) -> None:
    failed = dead_letter(admin, ui_fleet, "dlq-cli", "echo via-cli")
    entry = next(e for e in _cli(ui_fleet, "dlq", "ls") if e["job_id"] == failed["id"])
    assert _cli(ui_fleet, "dlq", "show", entry["id"])["job"]["state"] == "failed"

    replayed = _cli(ui_fleet, "dlq", "replay", entry["id"])

    assert replayed["id"] == failed["id"] and replayed["state"] in ("queued", "running", "succeeded")
    done = admin.get(f"/v1/jobs/{failed['id']}", params={"wait": 60}).json()
    assert done["state"] == "succeeded" and "via-cli" in done["result"]["output"]
