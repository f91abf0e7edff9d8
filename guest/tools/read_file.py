"""read_file: a workspace file as UTF-8 text or base64, whole or by line range / byte window.

A whole read of a file larger than limits.file_max_bytes is refused with an error naming the
limit; ranges read at most that many bytes. Invalid UTF-8 is replaced (U+FFFD) and flagged:
use base64 for binary files.
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
    arg_int,
    limit_error,
    os_error,
)


def _open(ctx: ToolContext, path: object) -> tuple[int, str]:
    real = ctx.paths.resolve(path)
    shown = ctx.paths.display(real)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise os_error(err, shown) from err
    return fd, shown


def _read_window(fd: int, offset: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.pread(fd, min(limit, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def _read_lines(fd: int, start: int, end: int | None, max_bytes: int) -> tuple[bytes, int]:
    """Lines start..end (1-based, inclusive) and the number of lines in the file read so far."""
    out: list[bytes] = []
    size = 0
    count = 0
    with os.fdopen(os.dup(fd), "rb") as f:
        for count, line in enumerate(f, 1):
            if end is not None and count > end:
                break
            if count >= start:
                size += len(line)
                if size > max_bytes:
                    raise limit_error("file_max_bytes", max_bytes, "the selected lines")
                out.append(line)
    return b"".join(out), count


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    encoding = arg_choice(args, "encoding", ("utf8", "base64"), default="utf8")
    start_line = arg_int(args, "start_line", minimum=1)
    end_line = arg_int(args, "end_line", minimum=1)
    offset = arg_int(args, "offset", minimum=0)
    limit = arg_int(args, "limit", minimum=0)
    max_bytes = int(ctx.limits["file_max_bytes"])
    fd, shown = _open(ctx, args.get("path"))
    try:
        st = os.fstat(fd)
        size = st.st_size
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{shown}: is a directory")
        extra: dict[str, Any] = {}
        if start_line is not None or end_line is not None:
            data, seen = _read_lines(fd, start_line or 1, end_line, max_bytes)
            extra = {"start_line": start_line or 1, "end_line": end_line, "lines_seen": seen}
        elif offset is not None or limit is not None:
            if limit is not None and limit > max_bytes:
                raise limit_error("file_max_bytes", max_bytes, f"limit {limit}")
            data = _read_window(fd, offset or 0, max_bytes if limit is None else limit)
            extra = {"offset": offset or 0, "eof": (offset or 0) + len(data) >= size}
        else:
            if size > max_bytes:
                raise ToolError(
                    f"{shown} is {size} bytes, which exceeds limits.file_max_bytes ({max_bytes}); "
                    "read it in parts with offset/limit or start_line/end_line"
                )
            data = _read_window(fd, 0, max_bytes + 1)
    except OSError as err:
        raise os_error(err, shown) from err
    finally:
        os.close(fd)
    return _answer(data, encoding, shown, size, extra)


def _answer(data: bytes, encoding: str, shown: str, size: int, extra: dict[str, Any]) -> Result:
    if encoding == "base64":
        content = binascii.b2a_base64(data, newline=False).decode("ascii")
        valid = True
    else:
        try:
            content, valid = data.decode("utf-8"), True
        except UnicodeDecodeError:
            content, valid = data.decode("utf-8", errors="replace"), False
    result: Result = {
        "output": content,  # the file's text (base64 with encoding=base64), as every tool's `output`
        "encoding": encoding,
        "path": shown,
        "size": size,
        "bytes_read": len(data),
        **extra,
    }
    if not valid:
        result["invalid_utf8"] = True
    return result
