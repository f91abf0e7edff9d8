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
    #: (offset, length) of the `end` line holding the result inline; None: in results/.
    end_line: tuple[int, int] | None = None

    def summary_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "tool": self.tool,
            "state": str(self.state),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "summary": self.summary,
        }


def _last_byte(path: str, size: int) -> bytes:
    with open(path, "rb") as f:
        return os.pread(f.fileno(), 1, size - 1)


def _line(rec: dict[str, Any]) -> bytes:
    return json.dumps(rec, separators=(",", ":")).encode()


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
                rec["job"], rec["tool"], rec.get("summary", ""), rec["ts"]
            )
        elif rec.get("e") == "end" and rec.get("job") in self.entries:
            entry = self.entries[rec["job"]]
            entry.state, entry.finished_at = rec["state"], rec["ts"]
            entry.end_line = where if "result" in rec else None

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
        self._append(
            _line({"e": "start", "job": job_id, "tool": tool, "summary": summary, "ts": entry.started_at}),
        )
        return entry

    def record_end(self, job_id: str, state: str, result: dict[str, Any]) -> None:
        entry = self.entries[job_id]
        entry.state, entry.finished_at = state, time.time()
        rec: dict[str, Any] = {"e": "end", "job": job_id, "state": str(state), "ts": entry.finished_at}
        line = _line({**rec, "result": result})
        if len(line) > INLINE_RESULT_BYTES:
            tmp = os.path.join(self._results, f".{job_id}.tmp")
            with open(tmp, "w") as f:
                json.dump(result, f, separators=(",", ":"))
            os.replace(tmp, self._result_path(job_id))
            self._append(_line(rec))
            entry.end_line = None
        else:
            entry.end_line = self._append(line)

    def _result_path(self, job_id: str) -> str:
        return os.path.join(self._results, job_id + ".json")

    def load_result(self, job_id: str) -> dict[str, Any]:
        entry = self.entries[job_id]
        try:
            if entry.end_line is not None:
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
        """Rewrite the journal with the running and the KEEP_JOBS newest finished jobs."""
        finished = [e for e in self.entries.values() if e.state != ExecutionState.running]
        drop = {e.job_id for e in finished[: max(0, len(finished) - KEEP_JOBS)]}
        tmp = self._path + ".tmp"
        old = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        size = 0
        with open(tmp, "wb") as f:
            for e in self.entries.values():
                if e.job_id in drop:
                    continue
                lines = [
                    _line(
                        {
                            "e": "start",
                            "job": e.job_id,
                            "tool": e.tool,
                            "summary": e.summary,
                            "ts": e.started_at,
                        }
                    )
                ]
                if e.end_line is not None:
                    lines.append(os.pread(old, e.end_line[1], e.end_line[0]))
                    e.end_line = (size + len(lines[0]) + 1, e.end_line[1])
                elif e.finished_at is not None:
                    lines.append(
                        _line({"e": "end", "job": e.job_id, "state": str(e.state), "ts": e.finished_at})
                    )
                for line in lines:
                    f.write(line + b"\n")
                    size += len(line) + 1
            f.flush()
            os.fsync(f.fileno())
        os.close(old)
        os.replace(tmp, self._path)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._size = size
        for job_id in drop:
            del self.entries[job_id]
            try:
                os.unlink(self._result_path(job_id))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
