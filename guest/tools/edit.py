"""edit: Anthropic text-editor commands (view, create, str_replace, insert, undo_edit).

Each change first saves the file's previous content in a per-file history in the state dir
(`edits/<hash of the path>/<n>`, an `absent` marker when the file did not exist), so undo_edit
restores it even across guest restarts. At most HISTORY_DEPTH steps are kept per file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from guest.tools.base import Result, ToolContext, ToolError, arg_choice, arg_int, limit_error, os_error
from guest.tools.write_file import write_atomic

#: Undo steps kept per file.
HISTORY_DEPTH = 20

#: Lines shown around a change in the confirmation snippet.
SNIPPET_LINES = 4

#: Marks a history step where the file did not exist (undo removes it).
ABSENT = b"\0atefleet:absent\0"


def _numbered(text: str, first: int = 1) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.split("\n"), first))


class _Editor:
    def __init__(self, ctx: ToolContext, args: dict[str, Any]) -> None:
        self.ctx = ctx
        self.args = args
        self.real = ctx.paths.resolve(args.get("path"), write=True)
        self.shown = ctx.paths.display(self.real)
        # Imported at the first edit, not at every guest start: hashlib loads OpenSSL (see
        # tests/guest/test_guest_imports.py).
        import hashlib

        digest = hashlib.sha256(self.real.encode()).hexdigest()[:32]
        self.history = os.path.join(ctx.state_dir, "edits", digest)

    def read(self) -> str:
        try:
            with open(self.real, "rb") as f:
                data = f.read(int(self.ctx.limits["file_max_bytes"]) + 1)
        except OSError as err:
            raise os_error(err, self.shown) from err
        if len(data) > self.ctx.limits["file_max_bytes"]:
            raise limit_error("file_max_bytes", self.ctx.limits["file_max_bytes"], f"{self.shown}")
        return data.decode("utf-8", errors="replace")

    def _steps(self) -> list[int]:
        try:
            return sorted(int(n) for n in os.listdir(self.history) if n.isdigit())
        except FileNotFoundError:
            return []

    def save_history(self) -> None:
        os.makedirs(self.history, exist_ok=True)
        steps = self._steps()
        try:
            with open(self.real, "rb") as f:
                previous = f.read()
        except FileNotFoundError:
            previous = ABSENT
        write_atomic(os.path.join(self.history, str((steps[-1] + 1) if steps else 1)), previous, 0o600)
        for old in steps[: max(0, len(steps) + 1 - HISTORY_DEPTH)]:
            os.unlink(os.path.join(self.history, str(old)))

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        if len(data) > self.ctx.limits["file_max_bytes"]:
            raise limit_error(
                "file_max_bytes", self.ctx.limits["file_max_bytes"], f"new content of {len(data)} bytes"
            )
        try:
            self.save_history()
            os.makedirs(os.path.dirname(self.real), exist_ok=True)
            write_atomic(self.real, data, None)
        except OSError as err:
            raise os_error(err, self.shown) from err

    def snippet(self, text: str, line: int) -> str:
        lines = text.split("\n")
        start = max(0, line - SNIPPET_LINES)
        shown = "\n".join(lines[start : line + SNIPPET_LINES + 1])
        return (
            f"The file {self.shown} has been edited. Here's a snippet of it:\n{_numbered(shown, start + 1)}"
        )


def _view(ed: _Editor) -> Result:
    if os.path.isdir(ed.real):
        from guest.tools.list_dir import run as list_dir

        listing = list_dir(ed.ctx, {"path": ed.args.get("path"), "depth": 2})
        return {"output": listing["output"], "path": ed.shown}
    text = ed.read()
    lines = text.split("\n")
    rng = ed.args.get("view_range")
    start, end = 1, len(lines)
    if rng is not None:
        if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(n, int) for n in rng)):
            raise ToolError("'view_range' must be a list of two integers [start, end]")
        start, end = rng[0], (len(lines) if rng[1] == -1 else rng[1])
        if not 1 <= start <= len(lines) or end < start or end > len(lines):
            raise ToolError(f"'view_range' {rng} is outside the file's lines 1..{len(lines)}")
    body = _numbered("\n".join(lines[start - 1 : end]), start)
    return {"output": body, "path": ed.shown, "start_line": start, "end_line": end}


def _create(ed: _Editor) -> Result:
    text = ed.args.get("file_text")
    if not isinstance(text, str):
        raise ToolError("'file_text' argument is required (a string)")
    if os.path.lexists(ed.real):
        raise ToolError(
            f"{ed.shown}: already exists; `create` cannot overwrite it (use write_file or str_replace)"
        )
    ed.write(text)
    return {"output": f"File created successfully at: {ed.shown}", "path": ed.shown}


def _str_replace(ed: _Editor) -> Result:
    old = ed.args.get("old_str")
    new = ed.args.get("new_str", "") or ""
    if not isinstance(old, str) or not old:
        raise ToolError("'old_str' argument is required (a non-empty string)")
    if not isinstance(new, str):
        raise ToolError("'new_str' must be a string")
    text = ed.read()
    count = text.count(old)
    if count == 0:
        raise ToolError(f"No replacement was performed: old_str did not appear verbatim in {ed.shown}.")
    if count > 1:
        lines = [text[:i].count("\n") + 1 for i in _positions(text, old)]
        raise ToolError(
            f"No replacement was performed: old_str appears {count} times (lines {lines}); make it unique."
        )
    at = text.index(old)
    new_text = text[:at] + new + text[at + len(old) :]
    ed.write(new_text)
    return {"output": ed.snippet(new_text, text[:at].count("\n")), "path": ed.shown}


def _positions(text: str, sub: str) -> list[int]:
    found, at = [], text.find(sub)
    while at != -1:
        found.append(at)
        at = text.find(sub, at + 1)
    return found


def _insert(ed: _Editor) -> Result:
    line = arg_int(ed.args, "insert_line", minimum=0)
    if line is None:
        raise ToolError("'insert_line' argument is required")
    new = ed.args.get("new_str", ed.args.get("insert_text"))
    if not isinstance(new, str):
        raise ToolError("'new_str' (or 'insert_text') argument is required (a string)")
    lines = ed.read().split("\n")
    if line > len(lines):
        raise ToolError(f"'insert_line' {line} is outside the file's lines 0..{len(lines)}")
    new_text = "\n".join(lines[:line] + new.split("\n") + lines[line:])
    ed.write(new_text)
    return {"output": ed.snippet(new_text, line), "path": ed.shown}


def _undo(ed: _Editor) -> Result:
    steps = ed._steps()
    if not steps:
        raise ToolError(f"No edit history for {ed.shown}")
    step = os.path.join(ed.history, str(steps[-1]))
    with open(step, "rb") as f:
        previous = f.read()
    try:
        if previous == ABSENT:
            os.unlink(ed.real)
        else:
            write_atomic(ed.real, previous, None)
    except OSError as err:
        raise os_error(err, ed.shown) from err
    os.unlink(step)
    return {"output": f"Last edit to {ed.shown} undone successfully.", "path": ed.shown}


_COMMANDS: dict[str, Callable[[_Editor], Result]] = {
    "view": _view,
    "create": _create,
    "str_replace": _str_replace,
    "insert": _insert,
    "undo_edit": _undo,
}


def run(ctx: ToolContext, args: dict[str, Any]) -> Result:
    command = arg_choice(args, "command", tuple(_COMMANDS))
    return _COMMANDS[command](_Editor(ctx, args))
