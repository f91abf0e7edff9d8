"""Typed views of what the API answers: jobs, sessions, tool results, problems, environments.

Every model ignores members it does not know (`extra="allow"` keeps them readable), so a newer
API adding fields never breaks an older SDK.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Problem(_Model):
    """An RFC 9457 problem document."""

    type: str = "about:blank"
    title: str = "Error"
    status: int = 500
    detail: str = ""
    instance: str | None = None

    @property
    def slug(self) -> str:
        """The last segment of `type` (after `/`, `:` or `#`), snake_case (`.../job-expired` →
        `job_expired`)."""
        return re.split(r"[/:#]", self.type.rstrip("/"))[-1].replace("-", "_")


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Job(_Model):
    """A job as `GET /v1/jobs/{id}` answers it."""

    id: str
    state: JobState
    environment: str = ""
    session: str = ""
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    #: Exactly the body the sync call would have answered (a tool result, or `{"status": "ok"}`).
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    webhook_attempts: list[dict[str, Any]] = []

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


class ToolResult(_Model):
    """A tool's answer in the seed's shape (`function_call_output`) with its structured fields."""

    type: str = "function_call_output"
    name: str = ""
    call_id: str | None = None
    output: str = ""
    is_error: bool = False
    exit_code: int | None = None
    timed_out: bool | None = None
    truncated: bool | None = None
    duration_ms: float | None = None


class SessionInfo(_Model):
    """A session as `GET /v1/environments/{env}/sessions/{sid}` answers it."""

    session: str
    state: str
    environment: str = ""
    actor: dict[str, Any] | None = None
    last_activity: str | None = None
    queue_depth: int = 0
    running_job: str | None = None
    background_processes: list[dict[str, Any]] = []
    cold_start: bool = False


class Environment(_Model):
    name: str
    template: str = ""
    atespace: str = ""
    skills_dir: str = ""
    allowed_tools: list[str] = []
    idle_timeout_s: float | None = None


class OutputChunk(_Model):
    """One chunk of a running job's output (`stream` is stdout or stderr)."""

    stream: str = "stdout"
    data: str = ""
