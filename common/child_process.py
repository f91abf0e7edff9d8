"""How `atefleet up` starts the processes it owns (the roles and the embedded Redis).

Each leads a process group of its own: a terminal's Ctrl-C (SIGINT to its foreground process
group) then reaches only the supervisor, which stops the roles in order and Redis last. A Redis
in the supervisor's group got that SIGINT too and shut down at once, while the roles still had
work to finish and clients to close. Each also gets SIGTERM when the supervisor dies, so a
SIGKILLed `up` leaves no orphans.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the thread that started it exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start_owned(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Popen `argv` in its own process group, tied to this process's lifetime (see above)."""
    return subprocess.Popen(argv, process_group=0, preexec_fn=_die_with_parent, **popen)
