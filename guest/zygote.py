"""The guest zygote: one process with the guest's modules imported, forking guests into sandboxes.

Most of a guest's cold start is its interpreter starting and importing (asyncio and our modules),
and with far more sessions than slots the fleet starts guests by the hundred. So the local
Substrate starts one zygote: a fresh interpreter (never a fork of the server: its memory holds
imported modules and nothing else), on the host, as the server's uid. A sandbox is still made by
bwrap, which runs a waiter in place of the guest; for each one, the zygote forks a child that joins
the waiter's namespaces (setns on a pidfd of it, every namespace bwrap made) and forks the guest
in them (so the guest is in the sandbox's pid namespace); the child exits at once and the guest is
reparented to the zygote, which the kernel reaps for (SIGCHLD ignored).

Before it runs any guest code the guest checks that its namespaces (every kind) and its root are
the waiter's, as the server saw them; then it makes itself what bwrap, setpriv and prlimit would
have made it: its own session, the sandbox's cwd, environment and rlimits, stdio on the slot's
log, no capability in any set (bounding and ambient too), no_new_privs, and as root the slot's uid
with no supplementary group, all checked in /proc/self/status. It exits without serving if
anything differs. Its modules were imported from the host's paths, which do not exist in the
sandbox: sys.path and every package's search path are moved to where the sandbox mounts them, so
a later import finds the same files.

The guest holds the write end of a pipe the waiter reads: when the guest exits, the waiter does,
and bwrap with it, as when bwrap runs the guest itself. The server also watches the guest's pidfd,
since the tenant (the waiter's uid) can stop the waiter.

Requests (common/zygote_protocol.py) are served one at a time; an empty read (the server closed
its end) ends the zygote.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import sys
import traceback
from typing import Any

# Imported here so that every guest forked finds them loaded (the point of a zygote).
import guest.__main__ as guest_main
from common.zygote_protocol import DEATH_FD, LISTEN_FD, NAMESPACES

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
#: Seconds the zygote waits for a forked child to report the guest's pid.
CHILD_REPORT_S = 10.0
#: Lines of /proc/self/status that must read exactly so in a guest (Uid is checked apart).
DROPPED = {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0, "NoNewPrivs": 1}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def namespaces_to_join(pid: int) -> int:
    """setns() flags of every namespace `pid` has and this process has not."""
    flags = 0
    for name, flag in NAMESPACES.items():
        if os.stat(f"/proc/{pid}/ns/{name}").st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
            flags |= flag
    return flags


def drop_privileges(uid: int | None) -> None:
    """What setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all
    --no-new-privs does (`uid` None: keep the uid, as a normal user's sandbox does)."""
    _check(_libc.prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0), "PR_SET_KEEPCAPS")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "PR_CAPBSET_DROP")
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "PR_CAP_AMBIENT")
    if uid is not None:
        os.setresuid(uid, uid, uid)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(ctypes.byref(header), (_CapData * 2)()), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")


def check_dropped(uid: int | None) -> None:
    """Raise unless /proc/self/status shows no capability and no_new_privs; and for a changed
    `uid`, it as every uid and gid and no supplementary group (else every uid and gid alike)."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    wrong = [k for k, v in DROPPED.items() if int(fields[k].strip(), 16) != v]
    uids, gids = ({int(i) for i in fields[k].split()} for k in ("Uid", "Gid"))
    if len(uids) != 1 or len(gids) != 1 or (uid is not None and uids | gids != {uid}):
        wrong.append("Uid/Gid")
    if uid is not None and fields["Groups"].strip():
        wrong.append("Groups")
    if wrong:
        raise PermissionError(f"guest privileges not dropped: {', '.join(wrong)}")


def rehome(moves: dict[str, str]) -> None:
    """Point sys.path and every imported package's search path at the sandbox's mounts: `moves`
    maps a host dir to where the sandbox has it."""

    def moved(path: str) -> str:
        for host, inside in sorted(moves.items(), key=lambda m: -len(m[0])):  # the deepest first
            if path == host or path.startswith(host + os.sep):
                return inside + path[len(host) :]
        return path

    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [moved(p) for p in search]
    sys.path[:] = [moved(p) for p in sys.path]
    sys.path_importer_cache.clear()


def become_guest(request: dict[str, Any], listen: int, log: int, death: int) -> None:
    """In the forked guest, inside the sandbox's namespaces: set it up, check it, serve. Never
    returns."""
    code = 1
    try:
        guest_main.not_dumpable()  # first: the tenant's commands run as this uid
        gc.enable()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Stdio on the slot's log first, so what follows reports there. Every fd is moved above
        # every target first, so no move overwrites one still to be moved.
        null = os.open("/dev/null", os.O_RDWR)
        high = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, 64) for f in (null, log, listen, death)]
        null, log, listen, death = high
        for fd, target in ((null, 0), (log, 1), (log, 2), (listen, LISTEN_FD), (death, DEATH_FD)):
            os.dup2(fd, target, inheritable=target != DEATH_FD)
        os.closerange(DEATH_FD + 1, os.sysconf("SC_OPEN_MAX"))
        root = os.stat("/")
        if [root.st_dev, root.st_ino] != request["root"]:
            raise PermissionError("the guest's root is not its sandbox's")
        joined = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in NAMESPACES}
        if joined != request["namespaces"]:
            raise PermissionError("the guest is not in every namespace of its sandbox")
        os.chdir(request["cwd"])
        for name, soft_hard in request["rlimits"].items():
            resource.setrlimit(getattr(resource, name), tuple(soft_hard))
        drop_privileges(request["uid"])
        check_dropped(request["uid"])
        os.environ.clear()
        os.environ.update(request["env"])
        rehome(request["moves"])
        argv = [*request["argv"], "--fd", str(LISTEN_FD)]
        sys.argv = ["-c", *argv]
        guest_main.main(argv)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _forked(request: dict[str, Any], fds: list[int], report: socket.socket) -> None:
    """The zygote's child: join the cgroup, then the waiter's namespaces, fork the guest, report
    its pid and a pidfd of it, exit. Never returns."""
    code = 1
    try:
        waiter, listen, log, death = fds
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for procs in request["cgroup_procs"]:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(request["oom_score_adj"]))
        _check(_libc.setns(waiter, namespaces_to_join(request["waiter_pid"])), "setns")
        pid = os.fork()
        if pid == 0:
            report.close()
            os.close(waiter)
            become_guest(request, listen, log, death)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(report, [json.dumps({"pid": pid}).encode()], [pidfd])
        code = 0
    except BaseException as e:
        report.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
    finally:
        os._exit(code)


def spawn(request: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
    """Fork a guest for `request`: its reply and the fds to send with it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        if os.fork() == 0:
            ours.close()
            _forked(request, fds, theirs)
        theirs.close()
        if not select.select([ours], [], [], CHILD_REPORT_S)[0]:
            return {"error": "the zygote's child did not report"}, []
        message, got, _, _ = socket.recv_fds(ours, 65536, 1)
        return (json.loads(message) if message else {"error": "the zygote's child died"}), got
    finally:
        ours.close()
        theirs.close()


def serve(sock: socket.socket) -> None:
    # Python's recipe for forking without exec: the collector was off while the zygote imported
    # (no freed holes in its pages), and what it holds is left out of every collection, so a
    # guest's collections neither copy the pages it shares with the zygote nor walk its objects.
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children and orphaned guests: the kernel reaps
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "PR_SET_CHILD_SUBREAPER")
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        if not message:
            return
        try:
            reply, out = spawn(json.loads(message), fds)
        except Exception as e:
            reply, out = {"error": f"{type(e).__name__}: {e}"}, []
        finally:
            for fd in fds:
                os.close(fd)
        try:
            socket.send_fds(sock, [json.dumps(reply).encode()], out)
        finally:
            for fd in out:
                os.close(fd)


def main() -> None:
    """`python -I -S -c ...` with the listening socket's fd as argv[1]."""
    serve(socket.socket(fileno=int(sys.argv[1])))


if __name__ == "__main__":
    main()
