"""What the local Substrate and the guest zygote (guest/zygote.py, local_substrate/zygote.py)
agree on: a request is one JSON message on a SOCK_SEQPACKET socket with the fds [pidfd of the
sandbox's waiter, the guest's listening socket, its log, the write end of the waiter's pipe]; the
reply is `{"pid": N}` (the guest's host pid) with a pidfd of the guest, or `{"error": "..."}`."""

from __future__ import annotations

#: setns() flag of each kind of namespace, by its name under /proc/PID/ns: a guest joins, and is
#: checked to be in, every one its sandbox's waiter has.
NAMESPACES: dict[str, int] = {
    "user": 0x10000000, "mnt": 0x00020000, "pid": 0x20000000, "net": 0x40000000,
    "ipc": 0x08000000, "uts": 0x04000000, "cgroup": 0x02000000,
}  # fmt: skip
#: Fd numbers a forked guest has them at: its listening socket (its `--fd`) and the waiter's pipe.
LISTEN_FD = 3
DEATH_FD = 4
