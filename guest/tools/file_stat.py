"""stat: type, size, mode and times of a workspace path (a symlink is described, not followed)."""

from __future__ import annotations

import os
import stat as st
from typing import Any

from guest.tools.base import Result, ToolContext, os_error


def _kind(mode: int) -> str:
    if st.S_ISLNK(mode):
        return "symlink"
    if st.S_ISDIR(mode):
        return "dir"
    return "file" if st.S_ISREG(mode) else "other"


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    real = ctx.paths.resolve_entry(args.get("path"))
    shown = ctx.paths.display(real)
    try:
        info = os.lstat(real)
        target = os.readlink(real) if st.S_ISLNK(info.st_mode) else None
    except OSError as err:
        raise os_error(err, shown) from err
    result: dict[str, Any] = {
        "path": shown,
        "type": _kind(info.st_mode),
        "size": info.st_size,
        "mode": f"{st.S_IMODE(info.st_mode):04o}",
        "mtime": info.st_mtime,
        "ctime": info.st_ctime,
    }
    if target is not None:
        result["target"] = target
    lines = [f"{k}: {v}" for k, v in result.items()]
    return {"output": "\n".join(lines), **result}
