"""`atefleet cp`: files to and from a session's workspace, binary-safe (base64 on the wire), in
parts with a progress bar for large ones.

A remote path is `ENV/SID:PATH`. Downloads read `DOWNLOAD_PART_BYTES` windows (`read_file` offset/limit)
until a short one. Uploads of one part are a single atomic `write_file`; larger ones write parts
next to the target and join them with one `bash` call (`cat` then `mv`), so the target appears
whole or not at all.
"""

from __future__ import annotations

import base64
import re
import shlex
import uuid
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from atefleet.client import Client, Session, ToolResult
from atefleet.client.errors import AtefleetError

#: Raw bytes per upload request: base64 makes it 4/3 larger, well under the API's default body
#: limit (`api.body_max_bytes`, 16 MiB).
UPLOAD_PART_BYTES = 4 << 20

#: Raw bytes per download request: its base64 must fit a job's stored result
#: (`jobs.result_max_bytes`, 1 MiB by default).
DOWNLOAD_PART_BYTES = 512 << 10

_REMOTE = re.compile(r"(?P<env>[^/:]+)/(?P<sid>[^/:]+):(?P<path>.+)")


class CopyError(AtefleetError):
    """A copy failed inside the session (the tool's own error message says why)."""


def copy(client: Client, source: str, destination: str, *, progress: bool) -> int:
    """Copy one file either way; the bytes copied."""
    src, dst = _REMOTE.fullmatch(source), _REMOTE.fullmatch(destination)
    if (src is None) == (dst is None):
        raise SystemExit("atefleet cp: exactly one of SOURCE and DESTINATION must be ENV/SID:PATH")
    with Progress(*Progress.get_default_columns()[:1], BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  disable=not progress, transient=True) as bar:
        if dst is not None:
            return upload(client.session(dst["env"], dst["sid"]), Path(source), dst["path"], bar)
        if src is not None:
            return download(client.session(src["env"], src["sid"]), src["path"], Path(destination), bar)
    raise AssertionError("unreachable: one side is remote")


def _checked(result: ToolResult) -> ToolResult:
    if result.is_error:
        raise CopyError(result.output)
    return result


def download(session: Session, path: str, target: Path, bar: Progress) -> int:
    task = bar.add_task(f"{path}", total=None)
    done = 0
    with target.open("wb") as out:
        while True:
            part = _checked(session.read_file(path, encoding="base64", offset=done,
                                              limit=DOWNLOAD_PART_BYTES))
            if part.truncated:
                raise CopyError("the API cut a part short (jobs.result_max_bytes is below "
                                f"{DOWNLOAD_PART_BYTES * 4 // 3} bytes)")
            data = base64.b64decode(part.output)
            out.write(data)
            done += len(data)
            bar.update(task, completed=done)
            if len(data) < DOWNLOAD_PART_BYTES:
                return done


def upload(session: Session, source: Path, path: str, bar: Progress) -> int:
    size = source.stat().st_size
    task = bar.add_task(f"{source.name}", total=size)
    with source.open("rb") as src:
        if size <= UPLOAD_PART_BYTES:
            _checked(session.write_file(path, base64.b64encode(src.read()).decode(), encoding="base64"))
            bar.update(task, completed=size)
            return size
        stem = f"{path}.atefleet-cp-{uuid.uuid4().hex[:8]}"
        parts: list[str] = []
        while chunk := src.read(UPLOAD_PART_BYTES):
            parts.append(f"{stem}.{len(parts)}")
            _checked(session.write_file(parts[-1], base64.b64encode(chunk).decode(), encoding="base64"))
            bar.advance(task, len(chunk))
    joined = " ".join(shlex.quote(p) for p in parts)
    _checked(session.bash(f"cat {joined} > {shlex.quote(stem)} && rm -f {joined} && "
                          f"mv -f {shlex.quote(stem)} {shlex.quote(path)}"))
    return size
