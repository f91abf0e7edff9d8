"""Path resolution: the kernel-resolved realpath matches os.path.realpath, and confinement is
checked again on every call (nothing about the tree below the workspace is cached)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guest.paths import PathResolver, realpath
from guest.tools.base import ToolError


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A workspace with files, directories and every kind of symlink realpath must handle."""
    ws = tmp_path / "ws"
    (ws / "d" / "e").mkdir(parents=True)
    (ws / "d" / "f.txt").write_text("f")
    (tmp_path / "outside").mkdir()
    os.symlink("d/f.txt", ws / "to-file")
    os.symlink("to-file", ws / "chain")
    os.symlink("d/e/../../d", ws / "to-dir-dotdot")
    os.symlink("missing", ws / "dangling")
    os.symlink("loop-b", ws / "loop-a")
    os.symlink("loop-a", ws / "loop-b")
    os.symlink(str(tmp_path / "outside"), ws / "out")
    os.mkfifo(ws / "fifo")
    return ws


@pytest.mark.parametrize(
    "rel",
    [
        ".",
        "d",
        "d/f.txt",
        "d/e",
        "new.txt",
        "no/such/dir/x",
        "to-file",
        "chain",
        "to-dir-dotdot/f.txt",
        "dangling",
        "dangling/below",
        "loop-a",
        "loop-a/x",
        "d/f.txt/below",
        "out",
        "out/x",
        "fifo",
    ],
)
def test_realpath_matches_os_path_realpath(tree: Path, rel: str) -> None:
    path = os.path.normpath(tree / rel)
    assert realpath(path) == os.path.realpath(path)


def test_a_symlink_swapped_in_after_a_check_is_refused(tree: Path, tmp_path: Path) -> None:
    # Given a path that resolved inside the workspace
    r = PathResolver(str(tree))
    assert r.resolve("d/f.txt") == str(tree / "d" / "f.txt")
    # When its directory is replaced by a symlink to outside the workspace
    os.rename(tree / "d", tree / "d-old")
    os.symlink(str(tmp_path / "outside"), tree / "d")
    # Then the same path is refused, for reading, writing and acting on the entry itself
    for write in (False, True):
        with pytest.raises(ToolError, match="symlink"):
            r.resolve("d/f.txt", write=write)
        with pytest.raises(ToolError, match="symlink"):
            r.resolve_entry("d/f.txt", write=write)


def test_read_only_roots_are_readable_only_and_shown_absolute(tree: Path, tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    (skills / "s").mkdir(parents=True)
    (skills / "s" / "SKILL.md").write_text("x")
    r = PathResolver(str(tree)).with_read_only((str(skills),))
    real = r.resolve(str(skills / "s" / "SKILL.md"))
    assert real == str(skills / "s" / "SKILL.md") and r.display(real) == real
    assert r.resolve_entry(str(skills)) == str(skills)
    with pytest.raises(ToolError, match="outside the workspace"):
        r.resolve(str(skills / "s" / "SKILL.md"), write=True)
    assert r.display(r.resolve("d/f.txt")) == "d/f.txt" and r.display(r.resolve(".")) == "."
    # A resolver without the read-only root (another call's) refuses the same path.
    with pytest.raises(ToolError, match="outside the workspace"):
        PathResolver(str(tree)).resolve(str(skills / "s" / "SKILL.md"))
