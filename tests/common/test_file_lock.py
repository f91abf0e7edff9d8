"""try_lock: one holder at a time, released by close or by its holder's death (real flock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.file_lock import try_lock


def test_one_holder_at_a_time_until_it_closes(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    held = try_lock(path)
    assert held is not None
    assert try_lock(path) is None
    assert path.stat().st_mode & 0o777 == 0o600
    os.close(held)
    again = try_lock(path)
    assert again is not None
    os.close(again)


def test_a_killed_holder_leaves_no_lock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, time; from common.file_lock import try_lock; "
         f"assert try_lock(pathlib.Path({str(path)!r})) is not None; print('held', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert try_lock(path) is None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 5
    while (fd := try_lock(path)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fd is not None
    os.close(fd)
