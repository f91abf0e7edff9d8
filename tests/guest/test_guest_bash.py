"""bash against a real guest: output, exit codes, signals, timeouts, bounds, env, stdin, limits."""

from __future__ import annotations

import hashlib
import os
import time

from guest_harness import GuestProc, call, new_job_id, wait_process_gone

from common.guest_client import GuestClient


async def test_stdout_stderr_exit_zero(client: GuestClient) -> None:
    r = await call(client, "bash", command="echo hi; echo warn >&2")
    assert (r["stdout"], r["stderr"], r["exit_code"], r["signal"]) == ("hi\n", "warn\n", 0, None)
    assert r["output"] == "hi\nwarn\n" and not r.get("is_error")
    assert r["timed_out"] is False and r["truncated"] is False and r["duration_ms"] > 0


async def test_cmd_and_code_aliases(client: GuestClient) -> None:
    assert (await call(client, "bash", cmd="echo a"))["stdout"] == "a\n"
    assert (await call(client, "bash", code="echo b"))["stdout"] == "b\n"


async def test_missing_and_invalid_arguments_name_the_argument(client: GuestClient) -> None:
    r = await call(client, "bash")
    assert r["is_error"] and "'command'" in r["error"]
    r = await call(client, "bash", command="true", timeout="soon")
    assert r["is_error"] and "'timeout'" in r["error"]
    r = await call(client, "bash", command="true", background="yes")
    assert r["is_error"] and "'background'" in r["error"]


async def test_nonzero_exit_is_a_result_in_seed_format(client: GuestClient) -> None:
    r = await call(client, "bash", command="echo out; echo bad >&2; exit 3")
    assert r["exit_code"] == 3 and r["is_error"]
    assert r["output"] == "Error: exit code 3: bad\n (stdout: out\n)"


async def test_killed_by_signal_reports_128_plus_signal(client: GuestClient) -> None:
    r = await call(client, "bash", command="kill -9 $$")
    assert (r["exit_code"], r["signal"]) == (137, 9)
    r = await call(client, "bash", command="sh -c 'kill -TERM $$'; exit $?")
    assert r["exit_code"] == 143


async def test_non_utf8_output_is_replaced_not_fatal(client: GuestClient) -> None:
    r = await call(client, "bash", command=r"printf 'ok\377\376end'")
    assert r["stdout"] == "ok\ufffd\ufffdend"


async def test_huge_output_keeps_head_and_tail_with_marker(client: GuestClient) -> None:
    limits = {"output_max_bytes": 4096}
    r = await call(
        client,
        "bash",
        limits=limits,
        command="echo HEAD; head -c 100000 /dev/zero | tr '\\0' x; echo; echo TAIL",
    )
    assert r["truncated"] and r["stdout_bytes_dropped"] == 100011 - 4096
    assert r["stdout"].startswith("HEAD\n") and r["stdout"].endswith("TAIL\n")
    assert f"[... {r['stdout_bytes_dropped']} bytes truncated ...]" in r["stdout"]
    assert r["stderr_bytes_dropped"] == 0


async def test_timeout_kills_the_whole_process_group(guest: GuestProc, client: GuestClient) -> None:
    started = time.monotonic()
    r = await call(client, "bash", timeout=1, command="sleep 300 & echo $! > child.pid; sleep 300")
    assert r["timed_out"] and r["is_error"] and "timed out after 1s" in r["output"]
    assert time.monotonic() - started < 10
    child = int((guest.workspace / "child.pid").read_text())
    await wait_process_gone(child)


async def test_timeout_above_the_limit_names_it(client: GuestClient) -> None:
    r = await call(client, "bash", limits={"timeout_max_s": 10}, command="true", timeout=11)
    assert r["is_error"] and "limits.timeout_max_s (10)" in r["error"]


async def test_env_reaches_the_process_only(guest: GuestProc, client: GuestClient) -> None:
    secret = "s3cr3t-value-123"
    r = await call(
        client,
        "bash",
        env={"MY_SECRET": secret},
        command='printf %s "$MY_SECRET" | md5sum; echo $HOME; env | wc -l',
    )
    lines = r["stdout"].splitlines()
    assert lines[0].split()[0] == hashlib.md5(secret.encode()).hexdigest()
    assert lines[1] == str(guest.workspace)
    assert int(lines[2]) < 12  # a minimal base environment, not the guest's own
    for root, _, files in os.walk(guest.state_dir):
        for name in files:
            assert secret.encode() not in open(os.path.join(root, name), "rb").read(), name
    assert secret.encode() not in (guest.tmp / "guest.log").read_bytes()


async def test_stdin_and_cwd(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "sub").mkdir()
    r = await call(client, "bash", command="cat; pwd", stdin="from stdin\n", cwd="sub")
    assert r["stdout"] == f"from stdin\n{guest.workspace / 'sub'}\n"
    r = await call(client, "bash", command="pwd", cwd="../..")
    assert r["is_error"] and "outside the workspace" in r["error"]


async def test_cancel_signals_the_group(client: GuestClient) -> None:
    job = new_job_id()
    view = await client.start(
        {"job_id": job, "tool": "bash", "arguments": {"command": "echo go; sleep 60"}, "wait_s": 1}
    )
    assert view["state"] == "running" and view["stdout"] == "go\n"
    await client.cancel(job, "SIGTERM")
    done = await client.poll(job, view["stdout_offset"], view["stderr_offset"], wait_s=5)
    assert done["state"] == "finished" and done["result"] is not None
    assert done["result"]["cancelled"] and done["result"]["signal"] == 15


async def test_max_processes_limit_is_named(tmp_path: object) -> None:
    g = GuestProc(tmp_path, max_processes=1)  # type: ignore[arg-type]
    await g.start()
    try:
        async with g.client() as c:
            first = new_job_id()
            await c.start(
                {"job_id": first, "tool": "bash", "arguments": {"command": "sleep 30"}, "wait_s": 0.2}
            )
            r = await call(c, "bash", command="true")
            assert r["is_error"] and "limits.max_processes (1)" in r["error"]
            await c.cancel(first, "SIGKILL")
    finally:
        assert g.stop() == 0
