"""rm: remove a file, a symlink (not its target) or a directory (`recursive` for non-empty ones).

The workspace root itself is never removed.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from guest.tools.base import Result, ToolContext, ToolError, arg_bool, os_error


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    recursive = arg_bool(args, "recursive")
    real = ctx.paths.resolve_entry(args.get("path"), write=True)
    shown = ctx.paths.display(real)
    if real == ctx.paths.root:
        raise ToolError("refusing to remove the workspace root")
    try:
        mode = os.lstat(real).st_mode
        if not stat.S_ISDIR(mode):
            os.unlink(real)
        elif recursive:
            import shutil  # only recursive removal needs it

            shutil.rmtree(real)
        else:
            if os.listdir(real):
                raise ToolError(f"{shown}: directory not empty; set recursive=true to remove it")
            os.rmdir(real)
    except OSError as err:
        raise os_error(err, shown) from err
    return {"output": f"Removed {shown}", "path": shown}
