"""The guest on every interpreter it may be given (the distribution's python3: 3.11 on Debian 12,
newer elsewhere): it uses nothing deprecated. Python 3.12 deprecated asyncio's child watchers and
3.14 removed them; a guest that still used one would fail every command there."""

from __future__ import annotations

from pathlib import Path

from guest_harness import GuestProc, call


async def test_commands_and_background_processes_with_deprecations_as_errors(tmp_path: Path) -> None:
    guest = GuestProc(tmp_path, python_flags=("-W", "error::DeprecationWarning"))
    await guest.start()
    try:
        async with guest.client() as client:
            r = await call(client, "bash", command="echo hi; exit 3")
            assert (r["stdout"], r["exit_code"]) == ("hi\n", 3)
            r = await call(client, "bash", command="kill -TERM $$")
            assert (r["exit_code"], r["signal"]) == (143, 15)
            started = await call(client, "bash", background=True, command="sleep 0.1; echo bg")
            r = await call(client, "process", action="logs", process_id=started["process_id"], wait=5)
            while r["status"] != "exited":
                r = await call(client, "process", action="logs", process_id=started["process_id"],
                               stdout_offset=r["stdout_offset"], wait=5)
            assert r["exit_code"] == 0
        assert guest.proc is not None and guest.proc.poll() is None
    finally:
        assert guest.stop() == 0
