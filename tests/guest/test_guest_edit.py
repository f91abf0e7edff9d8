"""edit (Anthropic text-editor commands) against a real guest, undo history included."""

from __future__ import annotations

from guest_harness import GuestProc, call

from common.guest_client import GuestClient


async def test_create_view_replace_insert_undo(guest: GuestProc, client: GuestClient) -> None:
    f = guest.workspace / "code.py"
    r = await call(client, "edit", command="create", path="code.py", file_text="a = 1\nb = 2\nc = 3")
    assert r["output"] == "File created successfully at: code.py"
    r = await call(client, "edit", command="create", path="code.py", file_text="x")
    assert r["is_error"] and "already exists" in r["error"]
    r = await call(client, "edit", command="view", path="code.py", view_range=[2, -1])
    assert r["output"] == "     2\tb = 2\n     3\tc = 3"
    r = await call(client, "edit", command="str_replace", path="code.py", old_str="b = 2", new_str="b = 20")
    assert "b = 20" in r["output"] and f.read_text() == "a = 1\nb = 20\nc = 3"
    r = await call(client, "edit", command="insert", path="code.py", insert_line=0, new_str="# top")
    assert f.read_text() == "# top\na = 1\nb = 20\nc = 3"
    r = await call(client, "edit", command="insert", path="code.py", insert_line=4, insert_text="d = 4")
    assert f.read_text().endswith("c = 3\nd = 4")
    for expected in ("# top\na = 1\nb = 20\nc = 3", "a = 1\nb = 20\nc = 3", "a = 1\nb = 2\nc = 3"):
        assert not (await call(client, "edit", command="undo_edit", path="code.py")).get("is_error")
        assert f.read_text() == expected
    assert not (await call(client, "edit", command="undo_edit", path="code.py")).get("is_error")
    assert not f.exists()  # undoing the create removes the file
    r = await call(client, "edit", command="undo_edit", path="code.py")
    assert r["is_error"] and "No edit history" in r["error"]


async def test_str_replace_must_match_exactly_once(guest: GuestProc, client: GuestClient) -> None:
    (guest.workspace / "t.txt").write_text("x\ny\nx\n")
    r = await call(client, "edit", command="str_replace", path="t.txt", old_str="x", new_str="z")
    assert r["is_error"] and "appears 2 times" in r["error"] and "[1, 3]" in r["error"]
    r = await call(client, "edit", command="str_replace", path="t.txt", old_str="nope", new_str="z")
    assert r["is_error"] and "did not appear verbatim" in r["error"]
    assert (guest.workspace / "t.txt").read_text() == "x\ny\nx\n"


async def test_edit_argument_errors(client: GuestClient) -> None:
    r = await call(client, "edit", command="explode", path="a")
    assert r["is_error"] and "'command'" in r["error"]
    r = await call(client, "edit", command="insert", path="a")
    assert r["is_error"]
    r = await call(client, "edit", command="view", path="../x")
    assert r["is_error"] and "outside the workspace" in r["error"]
    r = await call(client, "edit", command="view", path="missing.txt")
    assert r["is_error"] and "no such file" in r["error"]


async def test_undo_history_survives_restart(guest: GuestProc) -> None:
    async with guest.client() as c:
        await call(c, "edit", command="create", path="k.txt", file_text="one")
        await call(c, "edit", command="str_replace", path="k.txt", old_str="one", new_str="two")
    guest.stop()
    await guest.start()
    async with guest.client() as c:
        await call(c, "edit", command="undo_edit", path="k.txt")
    assert (guest.workspace / "k.txt").read_text() == "one"
