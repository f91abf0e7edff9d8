"""mkdir: create a directory in the workspace (with its parents unless `parents` is false)."""

from __future__ import annotations

import os
from typing import Any

from guest.tools.base import Result, ToolContext, arg_bool, arg_mode, os_error

#: Mode of new directories when the call names none (before the umask).
DEFAULT_MODE = 0o755


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    parents = arg_bool(args, "parents", default=True)
    mode = arg_mode(args)
    real = ctx.paths.resolve(args.get("path"), write=True)
    shown = ctx.paths.display(real)
    try:
        if parents:
            os.makedirs(real, mode=mode or DEFAULT_MODE, exist_ok=True)
        else:
            os.mkdir(real, mode or DEFAULT_MODE)
        if mode is not None:
            os.chmod(real, mode)
    except OSError as err:
        raise os_error(err, shown) from err
    return {"output": f"Created directory {shown}", "path": shown}
