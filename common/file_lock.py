"""Exclusive locks on files, held for as long as a process serves: the kernel drops them when
it dies, so no lock outlives its holder."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def try_lock(path: Path) -> int | None:
    """An open descriptor of `path` (created 0600 if absent) holding an exclusive flock, or None
    when another process holds it. Close the descriptor to release the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
