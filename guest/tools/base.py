"""What every tool gets (ToolContext), how it fails (ToolError) and typed argument readers.

A tool is `run(ctx, args)` returning the result dict (`output` + structured fields). A tool that
waits (for a command, for logs) returns an awaitable of it instead, after doing what it can at
once: a tool that needs no waiting then answers within the start request, with no task or loop
iteration of its own. Raising ToolError (at once or from the awaitable) turns into a result with
`is_error: true`; it is never a protocol error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from guest.output import BoundedOutput
    from guest.paths import PathResolver
    from guest.procs import ProcessManager

Result = dict[str, Any]
Canceller = Callable[[int, float], None]


class ToolError(Exception):
    """The tool failed in a way the agent should see (bad argument, file not found, limit hit)."""


@dataclass
class ToolContext:
    job_id: str
    paths: PathResolver
    limits: dict[str, Any]
    env: dict[str, str]
    skills_dir: str
    state_dir: str
    processes: ProcessManager
    stdout: BoundedOutput
    stderr: BoundedOutput
    #: Wakes pollers waiting on this execution's output.
    notify: Callable[[], None]
    #: Set by a tool that can be cancelled: called with (signal, grace_s).
    canceller: Canceller | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Tool = Callable[[ToolContext, dict[str, Any]], Result | Awaitable[Result]]


def _missing(name: str) -> ToolError:
    return ToolError(f"'{name}' argument is required")


def arg_str(args: dict[str, Any], name: str, default: str | None = None, required: bool = False) -> str:
    value = args.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return "" if default is None else default
    if not isinstance(value, str):
        raise ToolError(f"'{name}' must be a string")
    return value


def arg_opt_str(args: dict[str, Any], name: str) -> str | None:
    value = args.get(name)
    if value is not None and not isinstance(value, str):
        raise ToolError(f"'{name}' must be a string")
    return value


def arg_int(
    args: dict[str, Any], name: str, default: int | None = None, minimum: int | None = None
) -> int | None:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ToolError(f"'{name}' must be an integer")
    if minimum is not None and value < minimum:
        raise ToolError(f"'{name}' must be >= {minimum}")
    return value


def arg_float(args: dict[str, Any], name: str, default: float | None = None) -> float | None:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"'{name}' must be a number")
    if value < 0:
        raise ToolError(f"'{name}' must be >= 0")
    return float(value)


def arg_bool(args: dict[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ToolError(f"'{name}' must be a boolean")
    return value


def arg_choice(args: dict[str, Any], name: str, choices: tuple[str, ...], default: str | None = None) -> str:
    value = arg_str(args, name, default=default, required=default is None)
    if value not in choices:
        raise ToolError(f"'{name}' must be one of {', '.join(choices)}")
    return value


def arg_mode(args: dict[str, Any], name: str = "mode") -> int | None:
    """A file mode given as an octal string ("0644", "755") or an integer."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = int(value, 8)
        except ValueError:
            raise ToolError(f"'{name}' must be an octal string like \"0644\"") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o7777:
        raise ToolError(f"'{name}' must be a file mode between 0 and 07777")
    return value


def limit_error(limit: str, value: object, detail: str) -> ToolError:
    """An error naming the limit that was hit, e.g. `limits.file_max_bytes (10485760)`."""
    return ToolError(f"{detail} exceeds limits.{limit} ({value})")


def os_error(err: OSError, path: str) -> ToolError:
    """An OSError as the agent should read it: `<path>: <reason>`, no traceback, no host paths."""
    reason = err.strerror or type(err).__name__
    return ToolError(f"{path}: {reason.lower() if reason[:1].isupper() else reason}")
