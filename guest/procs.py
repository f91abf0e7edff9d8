"""Background processes (bash background=true) and the concurrent-process limit.

Each background process gets a directory in the state dir holding `meta.json` (its record) and
`stdout.log` / `stderr.log` (its output, spooled by the guest, bounded: the first
PROCESS_LOG_MAX_BYTES of each stream are kept, the rest counted as dropped). Logs are read by
byte offset. Records survive a guest restart: a process still alive (same pid and start time)
is reported running (detached: no exit code or stdin any more), a vanished one `unknown`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal as _signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from guest.spawn import exit_status, signal_group, spawn_shell, stop_group
from guest.tools.base import ToolError, limit_error

#: Bytes of each background stream kept on disk; later output is counted, not stored.
PROCESS_LOG_MAX_BYTES = 16 << 20

#: Read size of the output pumps.
CHUNK_BYTES = 65536


def _start_ticks(pid: int) -> int | None:
    """The start time (clock ticks, /proc) of a live process, to tell it from a reused pid;
    None when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] == b"Z" else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class ProcRecord:
    process_id: str
    pid: int
    command: str
    status: str
    exit_code: int | None
    signal: int | None
    started_at: float
    finished_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    job_id: str
    start_ticks: int | None = None
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    def info(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("start_ticks")
        return data


class BackgroundProcess:
    def __init__(self, record: ProcRecord, directory: str, proc: asyncio.subprocess.Process | None) -> None:
        self.record = record
        self.dir = directory
        self.proc = proc
        self.changed = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def log_path(self, stream: str) -> str:
        return os.path.join(self.dir, f"{stream}.log")

    def save(self) -> None:
        tmp = os.path.join(self.dir, "meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(asdict(self.record), f)
        os.replace(tmp, os.path.join(self.dir, "meta.json"))

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class ProcessManager:
    """Owns background processes and counts every running command against `max_processes`."""

    def __init__(self, state_dir: str, max_processes: int) -> None:
        self._dir = os.path.join(state_dir, "procs")
        os.makedirs(self._dir, exist_ok=True)
        self.max_processes = max_processes
        self.foreground = 0
        self._procs: dict[str, BackgroundProcess] = {}
        self._load()

    def _load(self) -> None:
        for name in sorted(os.listdir(self._dir)):
            directory = os.path.join(self._dir, name)
            try:
                with open(os.path.join(directory, "meta.json")) as f:
                    record = ProcRecord(**json.load(f))
            except (OSError, ValueError, TypeError):
                continue
            self._procs[record.process_id] = BackgroundProcess(record, directory, None)

    def _refresh(self, bp: BackgroundProcess) -> None:
        """A process from before a guest restart has no pipes: its liveness is read from /proc."""
        record = bp.record
        if bp.proc is None and record.status == "running":
            if record.start_ticks is None or _start_ticks(record.pid) != record.start_ticks:
                record.status = "unknown"
                bp.save()

    def running_count(self) -> int:
        for bp in self._procs.values():
            self._refresh(bp)
        bg = sum(1 for p in self._procs.values() if p.record.status == "running")
        return self.foreground + bg

    def check_capacity(self) -> None:
        if self.running_count() >= self.max_processes:
            raise limit_error("max_processes", self.max_processes, f"{self.running_count() + 1} processes")

    async def start(self, command: str, cwd: str, env: dict[str, str], job_id: str) -> ProcRecord:
        self.check_capacity()
        process_id = "proc_" + os.urandom(6).hex()
        directory = os.path.join(self._dir, process_id)
        os.makedirs(directory)
        try:
            proc = await spawn_shell(command, cwd, env, stdin=True)
        except OSError as err:
            raise ToolError(f"cannot start process: {err}") from err
        record = ProcRecord(
            process_id,
            proc.pid,
            command[:1000],
            "running",
            None,
            None,
            time.time(),
            None,
            0,
            0,
            job_id,
            _start_ticks(proc.pid),
        )
        bp = BackgroundProcess(record, directory, proc)
        bp.save()
        self._procs[process_id] = bp
        if proc.stdout is None or proc.stderr is None:
            raise ToolError("cannot start process: no output pipes")
        bp.tasks = [
            asyncio.create_task(self._pump(bp, "stdout", proc.stdout)),
            asyncio.create_task(self._pump(bp, "stderr", proc.stderr)),
        ]
        bp.tasks.append(asyncio.create_task(self._reap(bp, proc)))
        return record

    async def _pump(self, bp: BackgroundProcess, stream: str, reader: asyncio.StreamReader) -> None:
        with open(bp.log_path(stream), "ab") as log:
            while chunk := await reader.read(CHUNK_BYTES):
                self._append(bp, stream, log, chunk)

    def _append(self, bp: BackgroundProcess, stream: str, log: Any, chunk: bytes) -> None:
        size = getattr(bp.record, f"{stream}_bytes")
        keep = chunk[: max(0, PROCESS_LOG_MAX_BYTES - size)]
        if keep:
            log.write(keep)
            log.flush()
            setattr(bp.record, f"{stream}_bytes", size + len(keep))
        if len(keep) < len(chunk):
            dropped = getattr(bp.record, f"{stream}_dropped")
            setattr(bp.record, f"{stream}_dropped", dropped + len(chunk) - len(keep))
        bp.wake()

    async def _reap(self, bp: BackgroundProcess, proc: asyncio.subprocess.Process) -> None:
        returncode = await proc.wait()
        bp.record.exit_code, bp.record.signal = exit_status(returncode)
        bp.record.status = "exited"
        bp.record.finished_at = time.time()
        bp.save()
        bp.wake()
        # Children may hold the pipes after the leader exits; the byte counts are final after them.
        await asyncio.gather(*bp.tasks[:2], return_exceptions=True)
        bp.save()

    def get(self, process_id: object) -> BackgroundProcess:
        if not isinstance(process_id, str) or not process_id:
            raise ToolError("'process_id' argument is required")
        bp = self._procs.get(process_id)
        if bp is None:
            raise ToolError(f"no background process {process_id!r}")
        self._refresh(bp)
        return bp

    def list(self) -> list[dict[str, Any]]:
        for bp in self._procs.values():
            self._refresh(bp)
        return [bp.record.info() for bp in self._procs.values()]

    def send_signal(self, bp: BackgroundProcess, sig: int) -> bool:
        if bp.record.status != "running":
            return False
        return signal_group(bp.record.pid, sig)

    async def stop_all(self) -> None:
        """Graceful guest stop: every running background group gets SIGTERM, then SIGKILL."""
        running = [bp for bp in self._procs.values() if bp.proc is not None and bp.record.status == "running"]
        await asyncio.gather(*(stop_group(bp.proc, _signal.SIGTERM) for bp in running if bp.proc))
        for bp in running:
            for task in bp.tasks:
                task.cancel()
            await asyncio.gather(*bp.tasks, return_exceptions=True)
