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
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: The ids attached to every log line written while they are set.
_CONTEXT: ContextVar[dict[str, str]] = ContextVar("atefleet_log_context", default={})  # noqa: B039

_URL_PASSWORD = re.compile(r"(\w+://[^:/@\s]*:)[^@\s]+@")


def redact(text: str) -> str:
    """Mask the password of any URL in `text` (e.g. a Redis URL in an error message)."""
    return _URL_PASSWORD.sub(r"\1***@", text)


@contextmanager
def log_context(**ids: str | None) -> Iterator[None]:
    """Attach ids (job, session, principal, ...) to every log line in this block."""
    merged = {**_CONTEXT.get(), **{k: v for k, v in ids.items() if v}}
    token = _CONTEXT.set(merged)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


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
