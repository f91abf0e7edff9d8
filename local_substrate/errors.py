"""The local Substrate's one error type: a gRPC status code name and the message Substrate uses."""

from __future__ import annotations


class ControlError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def not_found(what: str) -> ControlError:
    return ControlError("NOT_FOUND", f"{what} not found")


def invalid(message: str) -> ControlError:
    return ControlError("INVALID_ARGUMENT", message)


def precondition(message: str) -> ControlError:
    return ControlError("FAILED_PRECONDITION", message)


def snapshot_failed(actor: str, err: Exception) -> ControlError:
    """A suspend whose snapshot was refused (over a template limit) or failed on the tenant's
    tree: the actor is back at its last snapshot, and a retry would not help."""
    return ControlError(
        "RESOURCE_EXHAUSTED", f"snapshot of {actor} failed: {err}; the actor is back at its last snapshot"
    )


def workspace_over_quota(actor: str, breach: str) -> ControlError:
    """The resume after the disk guard stopped the actor: refused once, saying why (the actor
    is SUSPENDED at its last snapshot; the next resume restores it)."""
    return ControlError(
        "RESOURCE_EXHAUSTED",
        f"{WORKSPACE_OVER_QUOTA}: {actor} was stopped: {breach}; the actor is back at its last snapshot, "
        "and the next resume restores it",
    )


#: The exact message clients match to tell capacity from configuration errors.
NO_FREE_WORKERS = "no free workers available"
IN_PROGRESS = "another operation is in progress"
VERSION_CONFLICT = "concurrent update conflict"
#: How a resume refused after a disk guard stop begins.
WORKSPACE_OVER_QUOTA = "workspace over quota"
