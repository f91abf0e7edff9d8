"""list_dir: a directory's entries, one per line (directories end in `/`), to an optional depth.

Symlinked directories are listed but not descended into. At most MAX_ENTRIES are returned.
"""

from __future__ import annotations

import os
from typing import Any

from guest.tools.base import Result, ToolContext, ToolError, arg_int, os_error

#: Entries returned at most; the answer says when the listing was cut.
MAX_ENTRIES = 10000

#: Deepest recursion accepted.
MAX_DEPTH = 20


def _kind(entry: os.DirEntry[str]) -> str:
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    return "file" if entry.is_file(follow_symlinks=False) else "other"


def _walk(real: str, prefix: str, depth: int, out: list[dict[str, Any]]) -> bool:
    """Append entries under `real`; False when MAX_ENTRIES was reached."""
    with os.scandir(real) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if len(out) >= MAX_ENTRIES:
            return False
        kind = _kind(entry)
        size = entry.stat(follow_symlinks=False).st_size if kind == "file" else None
        out.append({"name": prefix + entry.name, "type": kind, "size": size})
        if kind == "dir" and depth > 1 and not _walk(entry.path, prefix + entry.name + "/", depth - 1, out):
            return False
    return True


def _line(entry: dict[str, Any]) -> str:
    name = str(entry["name"])
    return name + "/" if entry["type"] == "dir" else name


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    depth = arg_int(args, "depth", default=1, minimum=1) or 1
    if depth > MAX_DEPTH:
        raise ToolError(f"'depth' must be <= {MAX_DEPTH}")
    path = args.get("path") or "."
    real = ctx.paths.resolve(path)
    shown = ctx.paths.display(real)
    entries: list[dict[str, Any]] = []
    try:
        if not os.path.isdir(real):
            raise ToolError(f"{shown}: not a directory")
        complete = _walk(real, "", depth, entries)
    except OSError as err:
        raise os_error(err, shown) from err
    text = "\n".join(_line(e) for e in entries) if entries else "(empty directory)"
    if not complete:
        text += f"\n[listing cut at {MAX_ENTRIES} entries]"
    return {"output": text, "path": shown, "entries": entries, "truncated": not complete}
