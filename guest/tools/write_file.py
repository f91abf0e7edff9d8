"""write_file: atomic write (temp file + rename) of UTF-8 or base64 content, parents created.

binascii and os.urandom, not base64 and secrets: secrets imports hashlib, which loads OpenSSL
into every guest at its start (tests/guest/test_guest_imports.py).
"""

from __future__ import annotations

import binascii
import os
import stat
from typing import Any

from guest.tools.base import (
    Result,
    ToolContext,
    ToolError,
    arg_choice,
    arg_mode,
    limit_error,
    os_error,
)

#: Mode of a new file when the call names none.
DEFAULT_MODE = 0o644


def _content(args: dict[str, Any], encoding: str) -> bytes:
    content = args.get("content")
    if content is None:
        raise ToolError("'content' argument is required")
    if not isinstance(content, str):
        raise ToolError("'content' must be a string")
    if encoding == "utf8":
        return content.encode("utf-8", errors="surrogateescape")
    try:
        return binascii.a2b_base64(content, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ToolError("'content' is not valid base64") from None


def write_atomic(real: str, data: bytes, mode: int | None) -> None:
    """Write `data` to a temp file beside `real` and rename it over `real` (never half-written)."""
    directory, name = os.path.split(real)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.lstat(real).st_mode)
        except FileNotFoundError:
            mode = DEFAULT_MODE
    tmp = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, real)
    except OSError:
        os.unlink(tmp)
        raise


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    encoding = arg_choice(args, "encoding", ("utf8", "base64"), default="utf8")
    mode = arg_mode(args)
    data = _content(args, encoding)
    max_bytes = int(ctx.limits["file_max_bytes"])
    if len(data) > max_bytes:
        raise limit_error("file_max_bytes", max_bytes, f"content of {len(data)} bytes")
    real = ctx.paths.resolve(args.get("path"), write=True)
    shown = ctx.paths.display(real)
    if real == ctx.paths.root or os.path.isdir(real):
        raise ToolError(f"{shown}: is a directory")
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        write_atomic(real, data, mode)
    except OSError as err:
        raise os_error(err, shown) from err
    return {
        "output": f"Successfully wrote {len(data)} bytes to {shown}",
        "path": shown,
        "bytes_written": len(data),
    }
