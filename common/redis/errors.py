"""Redis's error replies and connection failures, as redis-py's public exception classes.

The fleet's client raises what redis-py raises for the same reply, so callers (and arq, and the
tests' second implementation) catch one set of classes. The ones the fleet acts on:

    RedisError
    ├── RedisConnectionError        the connection failed or dropped: retried like an outage (503)
    │   ├── BusyLoadingError        LOADING: a restarted Redis still reading its AOF, same
    │   └── AuthenticationError     WRONGPASS, NOAUTH, invalid password
    ├── RedisTimeoutError           no reply within `socket_timeout`: an outage too
    └── ResponseError               any other error reply
        ├── NoScriptError           NOSCRIPT: Redis forgot a script (restart, SCRIPT FLUSH)
        ├── OutOfMemoryError        OOM: at maxmemory, the write was refused
        └── ReadOnlyError           READONLY: a replica (or a demoted primary) refused a write

A script's write refused for memory is an OOM reply on Redis 7 but an `ERR Error running
script ... -OOM ...` reply on Redis 6.2; both are OutOfMemoryError here (redis-py gives 6.2's as
a plain ResponseError).
"""

from __future__ import annotations

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ExecAbortError,
    ModuleError,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "OUTAGE", "AuthenticationError", "BusyLoadingError", "NoScriptError", "OutOfMemoryError",
    "ReadOnlyError", "RedisConnectionError", "RedisError", "RedisTimeoutError", "ResponseError",
    "connection_failed", "reply_error", "timed_out",
]

#: Failures that mean "Redis is unreachable for now": retry with backoff; the API answers 503.
OUTAGE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)

#: Error replies by their first word (the error code).
_BY_CODE: dict[str, type[RedisError]] = {
    "OOM": OutOfMemoryError,
    "WRONGPASS": AuthenticationError,
    "EXECABORT": ExecAbortError,
    "LOADING": BusyLoadingError,
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "NOAUTH": AuthenticationError,
    "NOPERM": NoPermissionError,
}

#: `ERR` replies told apart by their whole text.
_ERR_BY_TEXT: dict[str, type[RedisError]] = {
    "max number of clients reached": RedisConnectionError,
    "invalid password": AuthenticationError,
    "wrong number of arguments for 'auth' command": AuthenticationWrongNumberOfArgsError,
    "wrong number of arguments for 'AUTH' command": AuthenticationWrongNumberOfArgsError,
    "Client sent AUTH, but no password is set": AuthenticationError,
    "AUTH <password> called without any password configured for the default user. "
    "Are you sure your configuration is correct?": AuthenticationError,
    "Error loading the extension. Please check the server logs.": ModuleError,
    "Error unloading module: no such module with that name": ModuleError,
    "Error unloading module: the module exports one or more module-side data types, "
    "can't unload": ModuleError,
    "Error unloading module: operation not possible.": ModuleError,
}

#: How Redis 6.2 words a script's write refused at maxmemory (inside its `ERR Error running script`).
_SCRIPT_OOM = "-OOM command not allowed"


def reply_error(message: str) -> RedisError:
    """The exception for an error reply (its text without the leading `-`)."""
    code, _, rest = message.partition(" ")
    by_code = _BY_CODE.get(code)
    if by_code is not None:
        return by_code(rest)
    if code == "ERR":  # its text without the code, as redis-py gives it
        if _SCRIPT_OOM in rest:
            return OutOfMemoryError(rest)
        return _ERR_BY_TEXT.get(rest, ResponseError)(rest)
    return ResponseError(message)


def connection_failed(what: str, cause: BaseException | None = None) -> RedisConnectionError:
    """A connection that could not be made, or dropped (`what` says which), with its cause."""
    return RedisConnectionError(f"{what}: {cause!r}" if cause is not None else what)


def timed_out(timeout_s: float) -> RedisTimeoutError:
    return RedisTimeoutError(f"no reply from Redis within {timeout_s:g} s")
