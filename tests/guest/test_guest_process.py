"""Background processes: start, logs by offset with wait, stdin, signals, list."""

from __future__ import annotations

from guest_harness import call

from common.guest_client import GuestClient


async def test_background_logs_by_offset_and_wait(client: GuestClient) -> None:
    started = await call(
        client, "bash", background=True, command="for i in 1 2 3; do echo n$i; sleep 0.2; done; echo e >&2"
    )
    pid = started["process_id"]
    out_off = err_off = 0
    text = ""
    while True:
        r = await call(
            client,
            "process",
            action="logs",
            process_id=pid,
            stdout_offset=out_off,
            stderr_offset=err_off,
            wait=5,
        )
        text += r["stdout"]
        out_off, err_off = r["stdout_offset"], r["stderr_offset"]
        if r["status"] == "exited" and not r["more"]:
            break
    assert text == "n1\nn2\nn3\n" and r["exit_code"] == 0
    page = await call(client, "process", action="logs", process_id=pid, stdout_offset=3, limit=3)
    assert page["stdout"] == "n2\n" and page["stdout_offset"] == 6 and page["stderr"] == "e\n"


async def test_write_stdin_signal_status_list(client: GuestClient) -> None:
    started = await call(client, "bash", background=True, command="while read l; do echo got:$l; done")
    pid = started["process_id"]
    await call(client, "process", action="write_stdin", process_id=pid, data="hello\n")
    r = await call(client, "process", action="logs", process_id=pid, wait=5)
    assert r["stdout"] == "got:hello\n"
    assert (await call(client, "process", action="status", process_id=pid))["status"] == "running"
    listed = await call(client, "process", action="list")
    assert pid in [p["process_id"] for p in listed["processes"]]
    assert pid in [p["process_id"] for p in await client.list_processes()]
    r = await call(client, "process", action="signal", process_id=pid, signal="SIGINT")
    assert r["delivered"]
    r = await call(client, "process", action="logs", process_id=pid, stdout_offset=10, wait=5)
    assert r["status"] == "exited" and r["signal"] == 2 and r["exit_code"] == 130


async def test_kill_and_errors(client: GuestClient) -> None:
    pid = (await call(client, "bash", background=True, command="sleep 60"))["process_id"]
    assert (await call(client, "process", action="kill", process_id=pid))["delivered"]
    r = await call(client, "process", action="logs", process_id=pid, wait=5)
    assert r["status"] == "exited" and r["exit_code"] == 137
    assert (
        "no background process"
        in (await call(client, "process", action="status", process_id="proc_x"))["error"]
    )
    assert "'action'" in (await call(client, "process", action="dance", process_id=pid))["error"]
    assert "'action'" in (await call(client, "process"))["error"]
    assert (
        "'signal'"
        in (await call(client, "process", action="signal", process_id=pid, signal="SIGNOPE"))["error"]
    )
    r = await call(client, "process", action="write_stdin", process_id=pid, data="x")
    assert r["is_error"] and "stdin is not open" in r["error"]
