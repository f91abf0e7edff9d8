"""The guest protocol against a real guest process: identity, exactly-once, journal, long polls."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from guest_harness import ACTOR, GuestProc, call, new_job_id, wait_process_gone

from common.guest_client import (
    ActorMismatch,
    ExecutionNotFound,
    GuestClient,
    GuestProtocolError,
    GuestUnavailable,
)
from common.guest_protocol import ExecutionView, Limits


async def test_readyz_reports_binding_and_pid(guest: GuestProc, client: GuestClient) -> None:
    info = await client.readyz()
    assert info == {"ready": True, "actor": None, "pid": guest.proc.pid if guest.proc else 0}
    await call(client, "bash", command="true")
    assert (await client.readyz())["actor"] == ACTOR


async def test_bound_to_first_actor_even_after_restart(guest: GuestProc, client: GuestClient) -> None:
    await call(client, "bash", command="true")
    async with guest.client("s-other-0123456789abcde") as other:
        with pytest.raises(ActorMismatch) as err:
            await other.list_executions()
        assert err.value.bound == ACTOR
    guest.stop()
    await guest.start()
    async with guest.client("s-other-0123456789abcde") as other:
        with pytest.raises(ActorMismatch):
            await call(other, "bash", command="touch should-not-exist")
    assert not (guest.workspace / "should-not-exist").exists()
    async with guest.client(actor=None) as anonymous:  # type: ignore[arg-type]
        with pytest.raises(GuestProtocolError) as perr:
            await anonymous.list_executions()
        assert perr.value.status == 400


async def test_an_actor_named_by_the_launcher_refuses_every_other_even_first(tmp_path: Path) -> None:
    # given a guest started for ACTOR (as the local Substrate starts it)
    guest = GuestProc(tmp_path, actor=ACTOR)
    await guest.start()
    try:
        # when another actor's request comes first, then it is refused and nothing runs
        async with guest.client("s-intruder-0123456789abcde") as other:
            with pytest.raises(ActorMismatch) as err:
                await call(other, "bash", command="touch intruded")
            assert err.value.bound == ACTOR
        assert not (guest.workspace / "intruded").exists()
        # and the named actor is still served
        async with guest.client() as own:
            assert (await own.readyz())["actor"] == ACTOR
            assert (await call(own, "bash", command="echo ok"))["output"] == "ok\n"
    finally:
        guest.stop()


async def test_unavailable_when_no_guest(tmp_path: object) -> None:
    from common.guest_protocol import GuestAddress

    async with GuestClient(GuestAddress(uds=f"{tmp_path}/missing.sock"), actor=ACTOR) as c:
        with pytest.raises(GuestUnavailable):
            await c.readyz()


async def test_bad_requests(client: GuestClient) -> None:
    with pytest.raises(GuestProtocolError) as err:
        await client.start({"job_id": "../evil", "tool": "bash", "arguments": {}})
    assert err.value.status == 400
    with pytest.raises(ExecutionNotFound):
        await client.poll("never-started")


async def test_exactly_once_concurrent_and_after_completion(guest: GuestProc, client: GuestClient) -> None:
    job = new_job_id()
    args = {"command": "echo run >> runs.txt; sleep 0.5; echo done"}
    first, second = await asyncio.gather(client.run(job, "bash", args), client.run(job, "bash", args))
    assert first[0]["stdout"] == second[0]["stdout"] == "done\n"
    assert sorted([first[1]["attached"], second[1]["attached"]]) == [False, True]
    again, view = await client.run(job, "bash", args)
    assert view["attached"] and again == first[0]
    assert (guest.workspace / "runs.txt").read_text() == "run\n"
    # The same holds for non-bash tools and across a guest restart.
    wjob = new_job_id()
    await client.run(wjob, "write_file", {"path": "w.txt", "content": "v1"})
    (guest.workspace / "w.txt").write_text("changed later")
    guest.stop()
    await guest.start()
    async with guest.client() as c:
        result, view = await c.run(wjob, "write_file", {"path": "w.txt", "content": "v1"})
        assert view["attached"] and view["state"] == "finished" and result["bytes_written"] == 2
        assert (await c.run(job, "bash", args))[0] == first[0]
    assert (guest.workspace / "w.txt").read_text() == "changed later"
    assert (guest.workspace / "runs.txt").read_text() == "run\n"


async def test_killed_guest_reports_interrupted_and_keeps_process_records(guest: GuestProc) -> None:
    job = new_job_id()
    async with guest.client() as c:
        bg = await call(c, "bash", background=True, command="exec sleep 120")
        view = await c.start(
            {
                "job_id": job,
                "tool": "bash",
                "wait_s": 0.3,
                "arguments": {"command": "echo started; echo $$ > fg.pid; sleep 5; echo ran >> ran.txt"},
            }
        )
        assert view["state"] == "running"
    guest.kill9()
    fg_pid = int((guest.workspace / "fg.pid").read_text())
    os.killpg(fg_pid, signal.SIGKILL)  # its group outlived the guest; stop it so nothing writes later
    await guest.start()
    async with guest.client() as c:
        result, view = await c.run(job, "bash", {"command": "echo ran >> ran.txt"})
        assert view["state"] == "interrupted" and view["attached"]
        assert result["interrupted"] and result["is_error"] and "not re-run" in result["error"]
        assert not (guest.workspace / "ran.txt").exists()
        listed = {e["job_id"]: e for e in await c.list_executions()}
        assert listed[job]["state"] == "interrupted" and listed[job]["tool"] == "bash"
        procs = {p["process_id"]: p for p in await c.list_processes()}
        assert procs[bg["process_id"]]["status"] == "running"  # still alive: same pid and start time
        os.kill(bg["pid"], signal.SIGKILL)
    guest.stop()
    await wait_process_gone(bg["pid"])
    await guest.start()
    async with guest.client() as c:
        procs = {p["process_id"]: p for p in await c.list_processes()}
        assert procs[bg["process_id"]]["status"] == "unknown"


async def test_sigterm_stops_gracefully_and_interrupts_running(guest: GuestProc) -> None:
    job = new_job_id()
    async with guest.client() as c:
        await c.start({"job_id": job, "tool": "bash", "arguments": {"command": "sleep 60"}, "wait_s": 0.2})
    started = time.monotonic()
    assert guest.stop() == 0
    assert time.monotonic() - started < 5
    await guest.start()
    async with guest.client() as c:
        view = await c.poll(job)
        assert view["state"] == "interrupted"


class _CountingClient(GuestClient):
    """Records how long each poll was held, to show none exceeds the 5 s bound."""

    durations: list[float]

    async def poll(
        self, job_id: str, stdout_offset: int = 0, stderr_offset: int = 0, wait_s: float = 5.0,
        limits: Limits | None = None,
    ) -> ExecutionView:
        began = time.monotonic()
        try:
            return await super().poll(job_id, stdout_offset, stderr_offset, wait_s, limits)
        finally:
            self.durations.append(time.monotonic() - began)


async def test_sixty_second_command_through_short_polls(guest: GuestProc) -> None:
    from common.guest_protocol import GuestAddress

    chunks: list[tuple[str, str]] = []
    async with _CountingClient(GuestAddress(uds=guest.socket), actor=ACTOR) as c:
        c.durations = []
        result, view = await c.run(
            new_job_id(),
            "bash",
            {
                "command": "i=1; while [ $i -le 60 ]; do "
                "echo line $i; echo err $i >&2; sleep 1; i=$((i+1)); done"
            },
            on_output=lambda stream, data: chunks.append((stream, data)),
        )
    assert view["state"] == "finished" and result["exit_code"] == 0
    expected = "".join(f"line {i}\n" for i in range(1, 61))
    assert "".join(d for s, d in chunks if s == "stdout") == expected == result["stdout"]
    assert "".join(d for s, d in chunks if s == "stderr") == "".join(f"err {i}\n" for i in range(1, 61))
    assert len(c.durations) >= 12 and max(c.durations) < 5.5
