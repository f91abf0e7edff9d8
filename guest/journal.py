"""The execution journal: which jobs started and how they ended, kept on disk in the state dir.

`journal.jsonl` is append-only: a `start` record (written before the tool runs, so a job that
may have had effects is never forgotten; not fsynced, see `record_start`) and an `end` record
per job. A result of up to
INLINE_RESULT_BYTES is part of its `end` record (read back by offset, not kept in memory);
bigger ones live in `results/<job_id>.json`, written before the `end` record. On load, a job with
a `start` and no `end` was cut off by a guest crash: it is recorded as interrupted, never re-run.
The journal keeps the last KEEP_JOBS finished jobs; older ones are compacted away.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from common.guest_protocol import ExecutionState

log = logging.getLogger(__name__)

#: Finished jobs remembered (for duplicate starts and listing); older ones are forgotten.
KEEP_JOBS = 1000

#: Results up to this size (JSON) are stored in the journal line itself: one write per job.
INLINE_RESULT_BYTES = 64 << 10

#: Compact once the journal holds this many jobs.
COMPACT_AT = 2 * KEEP_JOBS

INTERRUPTED_ERROR = "interrupted: the guest stopped while this execution was running; it was not re-run"


@dataclass
class JournalEntry:
    job_id: str
    tool: str
    summary: str
    started_at: float
    finished_at: float | None = None
    state: str = ExecutionState.running
    #: (offset, length) of its `start` line and of its `end` line (once ended) in the journal.
    start_line: tuple[int, int] = (0, 0)
    end_line: tuple[int, int] | None = None
    #: Whether the `end` line holds the result; if not, it is in results/.
    result_inline: bool = False

    def lines(self) -> list[tuple[int, int]]:
        return [self.start_line] if self.end_line is None else [self.start_line, self.end_line]

    def summary_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "tool": self.tool,
            "state": str(self.state),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "summary": self.summary,
        }


def _copy(src: int, dst: int, offset: int, length: int) -> int:
    """Copy `length` bytes at `offset` of `src` to the end of `dst`, a MiB at a time."""
    left = length
    while left > 0:
        chunk = os.pread(src, min(left, 1 << 20), offset + length - left)
        if not chunk:
            raise OSError(f"journal shorter than expected at {offset + length - left}")
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        left -= len(chunk)
    return length


def _copy_lines(src: int, dst: int, lines: list[tuple[int, int]]) -> dict[int, int]:
    """Copy the lines at `lines` ((offset, length), sorted) of `src` to `dst`, each run of
    adjacent lines in one go; the new offset of each line, by its old one."""
    moved: dict[int, int] = {}
    size = run_start = run_end = 0
    for offset, length in lines:
        if offset != run_end:
            size += _copy(src, dst, run_start, run_end - run_start)
            run_start = offset
        moved[offset] = size + offset - run_start
        run_end = offset + length + 1  # the line and its newline
    _copy(src, dst, run_start, run_end - run_start)
    return moved


def _last_byte(path: str, size: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), 1, size - 1)


#: Compact JSON, as every journal line is written (and the HTTP server writes its answers).
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def compact_json(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


# The record lines are formatted by hand: byte for byte what compact_json makes of the same
# dict (strings through json's own escaper, floats by repr), at a fifth of its cost per call.
def _start_line(job_id: str, tool: str, summary: str, ts: float) -> bytes:
    return (
        f'{{"e":"start","job":{encode_basestring_ascii(job_id)},"tool":{encode_basestring_ascii(tool)},'
        f'"summary":{encode_basestring_ascii(summary)},"ts":{ts!r}}}'
    ).encode()


def _end_line(job_id: str, state: str, ts: float, result_json: bytes | None) -> bytes:
    """The `end` record; with the result inline when `result_json` is given."""
    head = (
        f'{{"e":"end","job":{encode_basestring_ascii(job_id)},'
        f'"state":{encode_basestring_ascii(state)},"ts":{ts!r}'
    )
    if result_json is None:
        return (head + "}").encode()
    return b"%s,\"result\":%s}" % (head.encode(), result_json)


def interrupted_result(partial: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        **(partial or {}),
        "output": f"Error: {INTERRUPTED_ERROR}",
        "is_error": True,
        "error": INTERRUPTED_ERROR,
        "interrupted": True,
    }


class Journal:
    def __init__(self, state_dir: str) -> None:
        self._path = os.path.join(state_dir, "journal.jsonl")
        self._results = os.path.join(state_dir, "results")
        os.makedirs(self._results, exist_ok=True)
        self.entries: dict[str, JournalEntry] = {}
        self._replay()
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        if self._size and _last_byte(self._path, self._size) != b"\n":
            self._append(b"")  # end a line torn by a crash, so the next record starts clean
        self._interrupt_unfinished()

    def _replay(self) -> None:
        try:
            with open(self._path, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:
            return
        offset = 0
        for line in lines:
            try:
                rec = json.loads(line) if line else None
            except ValueError:
                rec = None  # a record torn by a crash mid-write
            if isinstance(rec, dict):
                self._apply(rec, (offset, len(line)))
            offset += len(line) + 1

    def _apply(self, rec: dict[str, Any], where: tuple[int, int]) -> None:
        if rec.get("e") == "start":
            self.entries[rec["job"]] = JournalEntry(
                rec["job"], rec["tool"], rec.get("summary", ""), rec["ts"], start_line=where
            )
        elif rec.get("e") == "end" and rec.get("job") in self.entries:
            entry = self.entries[rec["job"]]
            entry.state, entry.finished_at = rec["state"], rec["ts"]
            entry.end_line, entry.result_inline = where, "result" in rec

    def _interrupt_unfinished(self) -> None:
        for entry in self.entries.values():
            if entry.state == ExecutionState.running:
                log.warning(
                    "job %s was running when the guest stopped: recorded as interrupted", entry.job_id
                )
                self.record_end(entry.job_id, ExecutionState.interrupted, interrupted_result())

    def _append(self, line: bytes) -> tuple[int, int]:
        """Append one record line; its (offset, length). The guest is the only writer."""
        where = (self._size, len(line))
        os.write(self._fd, line + b"\n")
        self._size += len(line) + 1
        return where

    def record_start(self, job_id: str, tool: str, summary: str) -> JournalEntry:
        """Note that `job_id` is about to run, before any of its effects.

        Written, not fsynced: a guest crash (the case the journal is for) keeps the write in the
        page cache. An fsync would only matter for a machine crash, and then the actor falls
        back to its last snapshot anyway — journal and workspace together, consistently — so it
        would buy nothing and cost ~0.4 ms on every call.
        """
        if len(self.entries) >= COMPACT_AT:
            self._compact()
        entry = JournalEntry(job_id, tool, summary, time.time())
        self.entries[job_id] = entry
        entry.start_line = self._append(_start_line(job_id, tool, summary, entry.started_at))
        return entry

    def record_end(self, job_id: str, state: str, result: dict[str, Any]) -> bytes:
        """Note how `job_id` ended; the result as recorded (compact JSON), for answers to reuse."""
        result_json = compact_json(result)
        entry = self.entries[job_id]
        entry.state, entry.finished_at = state, time.time()
        line = _end_line(job_id, str(state), entry.finished_at, result_json)
        if len(line) > INLINE_RESULT_BYTES:
            tmp = os.path.join(self._results, f".{job_id}.tmp")
            with open(tmp, "wb") as f:
                f.write(result_json)
            os.replace(tmp, self._result_path(job_id))
            entry.end_line = self._append(_end_line(job_id, str(state), entry.finished_at, None))
            entry.result_inline = False
        else:
            entry.end_line, entry.result_inline = self._append(line), True
        return result_json

    def _result_path(self, job_id: str) -> str:
        return os.path.join(self._results, job_id + ".json")

    def load_result(self, job_id: str) -> dict[str, Any]:
        entry = self.entries[job_id]
        try:
            if entry.end_line is not None and entry.result_inline:
                with open(self._path, "rb") as f:
                    result: dict[str, Any] = json.loads(
                        os.pread(f.fileno(), entry.end_line[1], entry.end_line[0])
                    )["result"]
                return result
            with open(self._result_path(job_id)) as f:
                result = json.load(f)
                return result
        except (OSError, ValueError, KeyError):
            return interrupted_result()

    def _compact(self) -> None:
        """Rewrite the journal with the running and the KEEP_JOBS newest finished jobs: their
        lines, copied as they are and in their order."""
        finished = [e for e in self.entries.values() if e.state != ExecutionState.running]
        drop = finished[: max(0, len(finished) - KEEP_JOBS)]
        dropped = {e.job_id for e in drop}
        kept = [e for e in self.entries.values() if e.job_id not in dropped]
        tmp = self._path + ".tmp"
        old = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        new = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            moved = _copy_lines(old, new, sorted(line for e in kept for line in e.lines()))
            os.fsync(new)
        finally:
            os.close(new)
            os.close(old)
        os.replace(tmp, self._path)
        for e in drop:
            del self.entries[e.job_id]
        for e in kept:
            e.start_line = (moved[e.start_line[0]], e.start_line[1])
            if e.end_line is not None:
                e.end_line = (moved[e.end_line[0]], e.end_line[1])
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = os.fstat(self._fd).st_size
        for e in drop:
            if not e.result_inline:  # most results are in their end line: no file to remove
                try:
                    os.unlink(self._result_path(e.job_id))
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
