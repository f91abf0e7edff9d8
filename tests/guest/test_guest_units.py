"""Pure logic: bounded output, UTF-8 cut points, path resolution, tool schemas, skill parsing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.config import KNOWN_TOOLS
from common.tool_schemas import TOOL_SCHEMAS, anthropic_tools, openai_tools
from guest.output import BoundedOutput, utf8_safe_end
from guest.paths import PathResolver
from guest.skills import SkillInvalid, split_frontmatter
from guest.tools.base import ToolError


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=2, max_value=512))
def test_bounded_output_keeps_head_and_tail(chunks: list[bytes], max_bytes: int) -> None:
    out = BoundedOutput(max_bytes)
    for c in chunks:
        out.write(c)
    data = b"".join(chunks)
    assert out.total == len(data)
    assert out.dropped == max(0, len(data) - max_bytes)
    head, _, _ = out.read_from(0, len(data) + 1)
    assert data.startswith(head)
    tail, end, skipped = out.read_from(len(head), len(data) + 1)
    assert end == len(data) and skipped == out.dropped and data.endswith(tail)


@given(st.text(max_size=50), st.integers(min_value=0, max_value=200))
def test_utf8_safe_end_never_splits_a_character(text: str, cut: int) -> None:
    data = text.encode()[:cut]
    data[: utf8_safe_end(data)].decode("utf-8")  # must not raise
    assert len(data) - utf8_safe_end(data) <= 3


def test_path_resolver(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    r = PathResolver(str(ws))
    assert r.resolve("a/b") == str(ws / "a/b")
    assert r.resolve(".") == str(ws)
    for bad in ("..", "../x", "/etc", "", "a/../../x", "a\0b"):
        with pytest.raises(ToolError):
            r.resolve(bad)
    os.symlink("/", ws / "root")
    with pytest.raises(ToolError):
        r.resolve("root/etc")
    assert r.resolve_entry("root") == str(ws / "root")  # the link itself, for rm/stat


def test_tool_schemas_cover_every_tool_and_render() -> None:
    assert set(TOOL_SCHEMAS) == set(KNOWN_TOOLS)
    oa = openai_tools(["bash", "read_file"])
    assert oa[0]["type"] == "function" and oa[0]["function"]["name"] == "bash"
    assert oa[0]["function"]["parameters"]["required"] == ["command"]
    an = anthropic_tools(KNOWN_TOOLS)
    assert [t["name"] for t in an] == list(KNOWN_TOOLS)
    assert all(t["input_schema"]["type"] == "object" for t in an)
    with pytest.raises(KeyError):
        openai_tools(["nope"])


def test_frontmatter_split() -> None:
    assert split_frontmatter("---\nname: a\n---\nbody\n") == ("name: a", "body")
    with pytest.raises(SkillInvalid):
        split_frontmatter("no frontmatter")
    with pytest.raises(SkillInvalid):
        split_frontmatter("---\nname: a\n")


def test_journal_replay_compaction_and_torn_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guest import journal as jmod

    monkeypatch.setattr(jmod, "KEEP_JOBS", 3)
    monkeypatch.setattr(jmod, "COMPACT_AT", 6)
    j = jmod.Journal(str(tmp_path))
    big = {"output": "z" * (jmod.INLINE_RESULT_BYTES + 10)}
    for i in range(8):
        j.record_start(f"j{i}", "bash", f"cmd {i}")
        j.record_end(f"j{i}", "finished", big if i == 7 else {"output": f"r{i}"})
    j.record_start("running", "bash", "sleep")
    assert "j0" not in j.entries and j.load_result("j5") == {"output": "r5"}
    j.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"e":"start","job":"torn"')  # a crash mid-write
    j2 = jmod.Journal(str(tmp_path))
    assert j2.load_result("j6") == {"output": "r6"} and j2.load_result("j7") == big
    assert j2.entries["running"].state == "interrupted" and j2.load_result("running")["interrupted"]
    j2.record_start("after", "stat", "")
    j2.record_end("after", "finished", {"output": "ok"})
    j2.close()
    j3 = jmod.Journal(str(tmp_path))
    assert j3.load_result("after") == {"output": "ok"} and "torn" not in j3.entries
