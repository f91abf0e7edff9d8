"""Starting `sh -c` commands: the base environment, process groups, signals, exit statuses.

Every command runs in its own session (process group), so a timeout or cancel reaches all of
its children. The environment is a minimal base plus the per-call variables: the guest's own
environment never leaks into commands.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal as _signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Protocol

from common.guest_protocol import SESSION_TOKEN_ENV, SESSION_TOKEN_FILE_ENV

#: PATH used when the guest itself was started without one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Seconds between SIGTERM and SIGKILL when a process group is stopped.
KILL_GRACE_S = 2.0

#: Read size of the foreground output readers.
CHUNK_BYTES = 65536

Sink = Callable[[bytes], None]


class GroupLeader(Protocol):
    """What stopping a group needs: asyncio's Process and ShellProcess both are one."""

    @property
    def pid(self) -> int: ...

    async def wait(self) -> int: ...


def base_env(workspace: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": workspace,
        "LANG": "C.UTF-8",
        "SHELL": "/bin/sh",
        "TERM": "dumb",
    }


def command_env(workspace: str, cwd: str, extra: dict[str, str]) -> dict[str, str]:
    env = base_env(workspace)
    env["PWD"] = cwd
    env.update(extra)
    return env


def expose_session_token(state_dir: str, env: dict[str, str]) -> None:
    """Give commands the session's identity token (SESSION_TOKEN_ENV, set by the worker on each
    call) as a file too: written (owner-only) when it changed, named by SESSION_TOKEN_FILE_ENV."""
    token = env.get(SESSION_TOKEN_ENV)
    if not token:
        return
    path = os.path.join(state_dir, "session-token")
    try:
        with open(path) as f:
            current = f.read()
    except FileNotFoundError:
        current = ""
    if current != token:
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        os.replace(tmp, path)
    env[SESSION_TOKEN_FILE_ENV] = path


async def spawn_shell(command: str, cwd: str, env: dict[str, str], stdin: bool) -> asyncio.subprocess.Process:
    """`sh -c command` in a new session, stdout/stderr piped, stdin piped or /dev/null."""
    kwargs: dict[str, Any] = {
        "stdin": asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        "stdout": asyncio.subprocess.PIPE,
        "stderr": asyncio.subprocess.PIPE,
        "cwd": cwd,
        "env": env,
        "start_new_session": True,
    }
    return await asyncio.create_subprocess_exec("/bin/sh", "-c", command, **kwargs)


class ShellProcess:
    """A foreground `sh -c` in a new session, driven by plain event-loop callbacks.

    Its pipes are non-blocking fds read by reader callbacks straight into the sinks, stdin is
    fed by a writer callback, and the exit comes from a pidfd the loop watches. Unlike
    asyncio.subprocess (a transport and protocol per pipe, a task per stream reader) this costs
    no task and little bookkeeping: that machinery was most of the guest's own time on a
    `bash true` call.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._loop = asyncio.get_running_loop()
        self.pid = popen.pid
        self.returncode: int | None = None
        self._popen = popen
        self._waiters: list[asyncio.Future[int | None]] = []
        self._readers: set[int] = set()
        self._drained: asyncio.Future[None] = self._loop.create_future()
        self._stdin_fd: int | None = None
        self._stdin_left = memoryview(b"")

    @classmethod
    def start(
        cls, command: str, cwd: str, env: dict[str, str], stdin: bytes | None, sinks: tuple[Sink, Sink]
    ) -> ShellProcess:
        """Spawn `sh -c command`; its stdout and stderr go to `sinks`, `stdin` (if any) to its stdin."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (_devnull(), -1)
        child_ends = [out_w, err_w] + ([in_r] if stdin is not None else [])
        try:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            for fd in (out_r, err_r, *([in_w] if stdin is not None else [])):
                os.close(fd)
            raise
        finally:
            for fd in child_ends:
                os.close(fd)
        proc = cls(popen)
        proc._watch(((out_r, sinks[0]), (err_r, sinks[1])))
        if stdin is not None:
            proc._stdin_fd, proc._stdin_left = in_w, memoryview(stdin)
            os.set_blocking(in_w, False)
            proc._feed()
        return proc

    def _watch(self, pipes: tuple[tuple[int, Sink], ...]) -> None:
        for fd, sink in pipes:
            os.set_blocking(fd, False)
            self._readers.add(fd)
            self._loop.add_reader(fd, self._readable, fd, sink)
        watch_exit(self.pid, self._exited)

    def _exited(self, returncode: int) -> None:
        self.returncode = returncode
        # Popen must know: one it thinks unreaped would be waited for again on collection.
        self._popen.returncode = returncode
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(returncode)

    def _readable(self, fd: int, sink: Sink) -> None:
        try:
            data = os.read(fd, CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            sink(data)
        else:
            self._close_reader(fd)

    def _close_reader(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        self._readers.discard(fd)
        if not self._readers and not self._drained.done():
            self._drained.set_result(None)

    def _feed(self) -> None:
        fd = self._stdin_fd
        if fd is None:
            return
        try:
            sent = os.write(fd, self._stdin_left) if self._stdin_left else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            # The command did not read all of its stdin: not an error of ours.
            self._close_stdin()
            return
        self._stdin_left = self._stdin_left[sent:]
        if self._stdin_left:
            self._loop.add_writer(fd, self._feed)
        else:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self._stdin_fd is not None:
            self._loop.remove_writer(self._stdin_fd)
            os.close(self._stdin_fd)
            self._stdin_fd = None

    async def wait_until(self, timeout: float | None) -> int | None:
        """The exit status, or None if the shell is still running after `timeout` seconds."""
        if self.returncode is not None:
            return self.returncode
        fut: asyncio.Future[int | None] = self._loop.create_future()
        self._waiters.append(fut)
        timer = self._loop.call_later(timeout, _settle, fut) if timeout is not None else None
        try:
            return await fut
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.remove(fut)

    async def wait(self) -> int:
        returncode = await self.wait_until(None)
        assert returncode is not None  # without a timeout only the exit resolves the wait
        return returncode

    async def drain(self, timeout: float) -> None:
        """Read what is left in the pipes; stop if children of the shell keep them open."""
        if self._readers:
            # Awaited directly, with a timer that settles it: no extra callback hop and loop
            # iteration as with asyncio.wait (close() below then stops the readers either way).
            timer = self._loop.call_later(timeout, _settle, self._drained)
            try:
                await self._drained
            finally:
                timer.cancel()
        self.close()

    def close(self) -> None:
        """Stop reading and feeding: closes whatever pipe is still open."""
        for fd in list(self._readers):
            self._close_reader(fd)
        self._close_stdin()


@functools.cache
def _devnull() -> int:
    """/dev/null for commands' stdin, opened once (Popen's DEVNULL opens it on every spawn)."""
    return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)


def _settle(fut: asyncio.Future[Any]) -> None:
    """Resolve a wait that timed out (to None), unless something resolved it first."""
    if not fut.done():
        fut.set_result(None)


def signal_group(pid: int, sig: int) -> bool:
    """Signal the process group led by `pid`; False when it is already gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def parse_signal(value: object, default: int = _signal.SIGTERM) -> int:
    """ "SIGTERM", "TERM", "15" or 15 → 15; ValueError on anything else."""
    if value is None:
        return int(default)
    if isinstance(value, int) and not isinstance(value, bool):
        sig = value
    elif isinstance(value, str) and value.isdigit():
        sig = int(value)
    elif isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        try:
            sig = int(_signal.Signals[name])
        except KeyError:
            raise ValueError(f"unknown signal {value!r}") from None
    else:
        raise ValueError(f"unknown signal {value!r}")
    if sig not in {int(s) for s in _signal.Signals}:
        raise ValueError(f"unknown signal {value!r}")
    return sig


def watch_exit(pid: int, on_exit: Callable[[int], None]) -> None:
    """Reap the child `pid` once it exits and call `on_exit` with its returncode (-N: killed by
    signal N), in the running loop. The loop watches a pidfd where the kernel has them (Linux 5.3
    on); elsewhere a thread waits for the child. asyncio's child watchers, which did this, are
    deprecated since Python 3.12 and gone in 3.14."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        waiter = threading.Thread(target=lambda: loop.call_soon_threadsafe(on_exit, _reap(pid)), daemon=True)
        waiter.start()
        return

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        on_exit(_reap(pid))

    loop.add_reader(pidfd, exited)


def _reap(pid: int) -> int:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 255  # reaped by someone else: its status is lost (asyncio answers the same)
    return os.waitstatus_to_exitcode(status)


def exit_status(returncode: int) -> tuple[int, int | None]:
    """(exit_code, signal): a process killed by signal N reports exit code 128+N, as shells do."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


async def stop_group(
    proc: GroupLeader, sig: int = _signal.SIGTERM, grace_s: float = KILL_GRACE_S
) -> None:
    """Signal the group, then SIGKILL it if the leader has not exited within `grace_s`."""
    if not signal_group(proc.pid, sig):
        return
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        pass
    # Children may outlive the leader; the whole group goes.
    signal_group(proc.pid, _signal.SIGKILL)
