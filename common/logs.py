"""JSON logs with the job, session and principal of the work in hand on every line.

Context is carried in contextvars, so each asyncio task (one per session in a worker, one per
request in the API) logs its own ids without passing them around. Values of per-call env vars
never reach a log: they are never put in a log call, and `redact` masks anything that looks like
a credential in free text that could contain one (URLs with passwords).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar, Token
from typing import Any

#: The ids attached to every log line written while they are set.
_CONTEXT: ContextVar[dict[str, str]] = ContextVar("atefleet_log_context", default={})  # noqa: B039

_URL_PASSWORD = re.compile(r"(\w+://[^:/@\s]*:)[^@\s]+@")


def redact(text: str) -> str:
    """Mask the password of any URL in `text` (e.g. a Redis URL in an error message)."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def log_context(**ids: str | None) -> LogContext:
    """Attach ids (job, session, principal, ...) to every log line in this `with` block."""
    return LogContext({k: v for k, v in ids.items() if v})


class LogContext:
    """The block of `log_context`; a plain class because a worker enters one per job, and a
    generator-based context manager costs twice as much."""

    __slots__ = ("_ids", "_token")

    def __init__(self, ids: dict[str, str]) -> None:
        self._ids = ids
        self._token: Token[dict[str, str]] | None = None

    def __enter__(self) -> None:
        outer = _CONTEXT.get()
        self._token = _CONTEXT.set({**outer, **self._ids} if outer else self._ids)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _CONTEXT.reset(self._token)


class JsonFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "role": self.role,
            "logger": record.name,
            "msg": redact(record.getMessage()),
            **_CONTEXT.get(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def setup_logging(role: str, level: str = "INFO") -> None:
    """Configure the root logger of a process: JSON lines on stderr, tagged with the role."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Access logs would repeat every request; our own request log carries the ids instead.
    logging.getLogger("uvicorn.access").disabled = True
