"""Wire format of the guest protocol (worker → guest, HTTP/JSON), shared by guest and worker.

Plain dataclasses and TypedDicts only: the guest imports this module, and it must stay cheap to
import (no pydantic). The HTTP routes are:

- `GET  /readyz` → `ReadyInfo`
- `POST /v1/executions` with `StartRequest` → `ExecutionView`
- `GET  /v1/executions/{job_id}?stdout_offset=&stderr_offset=&wait_s=` → `ExecutionView`
- `POST /v1/executions/{job_id}/cancel` with `CancelRequest` → `ExecutionView`
- `GET  /v1/executions` → `{"executions": [ExecutionSummary]}`
- `GET  /v1/processes` → `{"processes": [ProcessInfo]}`

Every `/v1` request carries `ACTOR_HEADER: <actor name>`; a guest serves the actor its launcher
named (else the first request's, guest/identity.py), another actor is answered 403
`{"error": "actor_mismatch", ...}`. Errors are JSON
`{"error": <code>, "message": <text>}` with a 4xx/5xx status.

Output offsets count bytes of the raw stream (stdout and stderr separately). A poll returns the
bytes after the given offsets (decoded as UTF-8, never splitting a character while the
execution runs) and the next offsets. Bytes that were dropped by the bound (the middle of a huge
stream) are skipped and counted in `stdout_skipped` / `stderr_skipped`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

#: Header naming the actor a request is meant for.
ACTOR_HEADER = "X-Atefleet-Actor"

#: Longest a guest holds one request (the cluster router's limit is a little above this).
MAX_WAIT_S = 5.0

#: The call env var carrying the session's identity token (minted at each resume by the worker,
#: workers/session_identity.py); the guest gives it to commands as this variable and as a file,
#: named by SESSION_TOKEN_FILE_ENV.
SESSION_TOKEN_ENV = "ATEFLEET_SESSION_TOKEN"
SESSION_TOKEN_FILE_ENV = "ATEFLEET_SESSION_TOKEN_FILE"

#: Job ids become file names in the guest's journal, so their alphabet is restricted.
JOB_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}$"


@dataclass(frozen=True)
class GuestAddress:
    """Where a guest listens: a unix socket (local substrate) or a base URL (cluster router).

    `headers` are sent on every request (cluster routing puts the Host header here).
    """

    uds: str | None = None
    base_url: str = "http://guest"
    headers: dict[str, str] = field(default_factory=dict)


class ExecutionState(StrEnum):
    running = "running"
    #: The tool finished (successfully or not); `result` holds the outcome.
    finished = "finished"
    #: The guest stopped while the execution ran; it was not (and will never be) re-run.
    interrupted = "interrupted"


#: States in which `result` is final.
TERMINAL_EXECUTION_STATES = frozenset({ExecutionState.finished, ExecutionState.interrupted})


class Limits(TypedDict, total=False):
    """Per-call limits; each missing key takes the guest's default (see `DEFAULT_LIMITS`)."""

    timeout_default_s: float
    timeout_max_s: float
    output_max_bytes: int
    file_max_bytes: int


#: Defaults matching `common.config.EnvLimits`.
DEFAULT_LIMITS: Limits = {
    "timeout_default_s": 120.0,
    "timeout_max_s": 3600.0,
    "output_max_bytes": 1 << 20,
    "file_max_bytes": 10 << 20,
}


class StartRequest(TypedDict):
    """Body of `POST /v1/executions`."""

    job_id: str
    tool: str
    arguments: dict[str, Any]
    #: Per-call environment variables for bash; never persisted or logged by the guest.
    env: NotRequired[dict[str, str]]
    limits: NotRequired[Limits]
    #: In-actor skills directory; the guest's `--skills-dir` when absent.
    skills_dir: NotRequired[str]
    #: How long to hold the answer waiting for completion (capped at MAX_WAIT_S).
    wait_s: NotRequired[float]


class CancelRequest(TypedDict, total=False):
    """Body of `POST /v1/executions/{job_id}/cancel`."""

    #: Signal name ("SIGTERM", "TERM") or number; default SIGTERM, then SIGKILL after `grace_s`.
    signal: str | int
    grace_s: float


class ToolResult(TypedDict, total=False):
    """The outcome of one tool call. Tool errors are results, never protocol errors.

    Every result has `output` (the seed-compatible text). Errors have `is_error` and `error`.
    bash adds stdout, stderr, exit_code, signal, timed_out, truncated, stdout_bytes_dropped,
    stderr_bytes_dropped, duration_ms (and cancelled); other tools add their structured fields.
    """

    output: str
    is_error: bool
    error: str
    interrupted: bool


class ExecutionView(TypedDict):
    """Answer of start, poll and cancel: the state, new output since the offsets, and the result."""

    job_id: str
    tool: str
    state: str
    #: True when this start found the job already known (running or recorded): no new run.
    attached: bool
    started_at: float
    finished_at: float | None
    stdout: str
    stderr: str
    stdout_offset: int
    stderr_offset: int
    stdout_skipped: int
    stderr_skipped: int
    #: More output is available after the returned offsets (poll again at once).
    more_output: bool
    result: ToolResult | None


class ExecutionSummary(TypedDict):
    job_id: str
    tool: str
    state: str
    started_at: float
    finished_at: float | None
    #: A short description (bash: the command's beginning; files: the path).
    summary: str


class ProcessInfo(TypedDict):
    """A background process started with `bash background=true`."""

    process_id: str
    pid: int
    command: str
    #: running | exited | unknown (the guest restarted and the process is gone).
    status: str
    exit_code: int | None
    signal: int | None
    started_at: float
    finished_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    job_id: str


class ReadyInfo(TypedDict):
    ready: bool
    actor: str | None
    pid: int
