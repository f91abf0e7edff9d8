"""How a start is answered: a tool that needs no waiting is finished within its start request, and a
command can be cancelled from the moment its start is answered."""

from __future__ import annotations

from typing import Any

from guest_harness import GuestProc, new_job_id

from common.guest_client import GuestClient
from common.guest_protocol import StartRequest


async def test_a_file_tool_is_finished_by_its_start_even_without_waiting(
    guest: GuestProc, client: GuestClient
) -> None:
    (guest.workspace / "f.txt").write_text("hello")
    job = new_job_id()
    request: StartRequest = {"job_id": job, "tool": "read_file", "arguments": {"path": "f.txt"}, "wait_s": 0}
    view = await client.start(request)
    assert view["state"] == "finished" and not view["attached"]
    assert view["result"] is not None and view["result"]["output"] == "hello"
    again = await client.start(request)
    assert again["attached"] and again["result"] == view["result"]
    failed = await client.start(
        {"job_id": new_job_id(), "tool": "read_file", "arguments": {"path": "nope"}, "wait_s": 0}
    )
    assert failed["state"] == "finished" and failed["result"] is not None and failed["result"]["is_error"]


async def test_a_command_cancelled_right_after_its_start_is_stopped(client: GuestClient) -> None:
    job = new_job_id()
    view = await client.start(
        {"job_id": job, "tool": "bash", "arguments": {"command": "sleep 60"}, "wait_s": 0}
    )
    assert view["state"] == "running"
    await client.cancel(job, "SIGKILL")
    done = await client.poll(job, wait_s=5)
    assert done["state"] == "finished" and done["result"] is not None
    result: dict[str, Any] = dict(done["result"])
    assert result["cancelled"] and result["signal"] == 9
