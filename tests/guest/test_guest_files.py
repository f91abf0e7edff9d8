"""File tools against a real guest: round trips, ranges, limits, confinement, errors."""

from __future__ import annotations

import base64
import os

from guest_harness import GuestProc, call

from common.guest_client import GuestClient


async def test_write_then_read_utf8(guest: GuestProc, client: GuestClient) -> None:
    w = await call(client, "write_file", path="a/b/hello.txt", content="héllo\nworld\n")
    assert w["output"] == "Successfully wrote 13 bytes to a/b/hello.txt"
    assert (guest.workspace / "a/b/hello.txt").read_text() == "héllo\nworld\n"
    r = await call(client, "read_file", path="a/b/hello.txt")
    assert r["output"] == "héllo\nworld\n" and r["size"] == 13


async def test_binary_round_trip_128k_plus_3_via_base64(guest: GuestProc, client: GuestClient) -> None:
    data = os.urandom(128 * 1024 + 3)
    w = await call(
        client, "write_file", path="blob.bin", content=base64.b64encode(data).decode(), encoding="base64"
    )
    assert w["bytes_written"] == len(data)
    assert (guest.workspace / "blob.bin").read_bytes() == data
    r = await call(client, "read_file", path="blob.bin", encoding="base64")
    assert base64.b64decode(r["output"]) == data


async def test_write_mode_and_atomic_replace(guest: GuestProc, client: GuestClient) -> None:
    await call(client, "write_file", path="run.sh", content="#!/bin/sh\necho ok\n", mode="0755")
    assert oct((guest.workspace / "run.sh").stat().st_mode & 0o777) == "0o755"
    await call(client, "write_file", path="run.sh", content="#!/bin/sh\necho new\n")
    assert oct((guest.workspace / "run.sh").stat().st_mode & 0o777) == "0o755"  # mode kept on replace
    assert [p.name for p in guest.workspace.iterdir()] == ["run.sh"]  # no temp file left
    assert (await call(client, "bash", command="./run.sh"))["stdout"] == "new\n"


async def test_line_range_and_byte_window(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    r = await call(client, "read_file", path="lines.txt", start_line=3, end_line=4)
    assert r["output"] == "line 3\nline 4\n"
    r = await call(client, "read_file", path="lines.txt", offset=7, limit=7)
    assert r["output"] == "line 2\n" and not r["eof"]


async def test_size_cap_names_the_limit(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "big.txt").write_bytes(b"x" * 5000)
    limits = {"file_max_bytes": 4096}
    r = await call(client, "read_file", limits=limits, path="big.txt")
    assert r["is_error"] and "limits.file_max_bytes (4096)" in r["error"]
    r = await call(client, "read_file", limits=limits, path="big.txt", offset=4096, limit=1000)
    assert r["output"] == "x" * 904
    r = await call(client, "write_file", limits=limits, path="w.txt", content="y" * 5000)
    assert r["is_error"] and "limits.file_max_bytes (4096)" in r["error"]


async def test_invalid_utf8_is_flagged(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "bin").write_bytes(b"ok\xff")
    r = await call(client, "read_file", path="bin")
    assert r["output"] == "ok\ufffd" and r["invalid_utf8"]


async def test_errors_are_results(guest: GuestProc, client: GuestClient) -> None:
    r = await call(client, "read_file", path="nope.txt")
    assert r["is_error"] and r["output"] == "Error: nope.txt: no such file or directory"
    r = await call(client, "read_file")
    assert r["is_error"] and "'path'" in r["error"]
    r = await call(client, "write_file", path="x.txt")
    assert r["is_error"] and "'content'" in r["error"]
    for bad in ("!!", "aGk=\n", "aGk", "aé==", "aGk=aGk="):
        r = await call(client, "write_file", path="x.txt", content=bad, encoding="base64")
        assert r["is_error"] and "'content' is not valid base64" in r["error"], bad
    assert not (guest.workspace / "x.txt").exists()
    r = await call(client, "read_file", path="x", encoding="latin1")
    assert r["is_error"] and "'encoding'" in r["error"]
    r = await call(client, "no_such_tool")
    assert r["is_error"] and "unsupported tool" in r["error"]


async def test_path_escapes_are_refused(guest: GuestProc, client: GuestClient, tmp_path: object) -> None:
    outside = guest.tmp / "outside.txt"
    outside.write_text("secret")
    os.symlink(outside, guest.workspace / "link")
    os.symlink(guest.tmp, guest.workspace / "dirlink")
    for tool, args in [
        ("read_file", {"path": "../outside.txt"}),
        ("read_file", {"path": str(outside)}),
        ("read_file", {"path": "/etc/passwd"}),
        ("read_file", {"path": "link"}),
        ("read_file", {"path": "dirlink/outside.txt"}),
        ("write_file", {"path": "dirlink/new.txt", "content": "x"}),
        ("write_file", {"path": "link", "content": "x"}),
        ("list_dir", {"path": ".."}),
        ("mkdir", {"path": "dirlink/sub"}),
        ("rm", {"path": "dirlink/outside.txt"}),
        ("stat", {"path": "../outside.txt"}),
    ]:
        r = await call(client, tool, **args)
        assert r["is_error"] and "outside the workspace" in r["error"], (tool, args, r)
    assert outside.read_text() == "secret" and not (guest.tmp / "new.txt").exists()


async def test_inside_symlink_and_dotdot_that_stays_inside_are_fine(
    guest: GuestProc, client: GuestClient
) -> None:
    (guest.workspace / "d").mkdir()
    (guest.workspace / "d/f.txt").write_text("inside")
    os.symlink("d/f.txt", guest.workspace / "ok-link")
    assert (await call(client, "read_file", path="ok-link"))["output"] == "inside"
    assert (await call(client, "read_file", path="d/../d/f.txt"))["output"] == "inside"
    assert (await call(client, "read_file", path=str(guest.workspace / "d/f.txt")))["output"] == "inside"


async def test_list_dir_seed_format_structured_and_depth(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "src/pkg").mkdir(parents=True)
    (guest.workspace / "src/pkg/m.py").write_text("x = 1\n")
    (guest.workspace / "README").write_text("r")
    r = await call(client, "list_dir")
    assert r["output"] == "README\nsrc/"
    assert r["entries"][0] == {"name": "README", "type": "file", "size": 1}
    r = await call(client, "list_dir", path="src", depth=3)
    assert r["output"] == "pkg/\npkg/m.py"
    r = await call(client, "list_dir", path="README")
    assert r["is_error"] and "not a directory" in r["error"]
    (guest.workspace / "empty").mkdir()
    assert (await call(client, "list_dir", path="empty"))["output"] == "(empty directory)"


async def test_mkdir_rm_stat(guest: GuestProc, client: GuestClient) -> None:
    r = await call(client, "mkdir", path="x/y/z")
    assert r["output"] == "Created directory x/y/z" and (guest.workspace / "x/y/z").is_dir()
    (guest.workspace / "x/y/z/f").write_text("12345")
    s = await call(client, "stat", path="x/y/z/f")
    assert (s["type"], s["size"], s["mode"]) == ("file", 5, "0644")
    r = await call(client, "rm", path="x")
    assert r["is_error"] and "recursive=true" in r["error"]
    assert not (await call(client, "rm", path="x", recursive=True)).get("is_error")
    assert not (guest.workspace / "x").exists()
    for root in (".", "/", str(guest.workspace), "a/.."):
        r = await call(client, "rm", path=root, recursive=True)
        assert r["is_error"], root
    assert guest.workspace.is_dir()
    os.symlink("/etc", guest.workspace / "etc-link")
    s = await call(client, "stat", path="etc-link")
    assert s["type"] == "symlink" and s["target"] == "/etc"
    assert not (await call(client, "rm", path="etc-link")).get("is_error")  # removes the link only
    assert os.path.isdir("/etc")
