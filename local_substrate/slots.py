"""Worker slots: where actors' guests run, at most `slots` at a time.

A slot owns host dirs (workspace/, state/, tmp/, root/, trash/ under `slots/<slot>/`, the socket dir
under `sock/<slot>/`) and a sandbox uid. There are `slots` + `frozen_max` of them: an actor
suspended with its sandbox frozen (local_substrate/frozen.py) keeps its slot's dirs and uid but
not its place among the `slots` running at once. `SlotPool.claim` hands out an empty slot (the
least recently used one, so consecutive resumes spread over slots) while fewer than `slots` run;
`oldest_frozen` names the one to empty when none is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

from common.file_lock import try_lock
from local_substrate.layout import Layout
from local_substrate.sandbox import SandboxProcess
from local_substrate.trees import remove_tree

log = logging.getLogger(__name__)

#: Sandbox uids (as root): each serving local Substrate holds its own block of UID_BLOCK uids from
#: UID_FIRST on, so two on one host never share a uid, hence an RLIMIT_NPROC budget or a kill by
#: uid; in a block, uid 0 bakes golden snapshots and slot i runs as uid i + 1.
UID_FIRST = 200_000
UID_BLOCK = 1025
UID_BLOCKS = 2000
#: Where a server as root holds an exclusive lock on its block's file while it serves (the kernel
#: drops it with the process). Root-only: a normal user's sandboxes all run as that user.
UID_LOCKS = Path("/run/atefleet-uid-blocks")
#: Where the host lists the ids it has given out (`_host_ids`).
ETC = Path("/etc")


@dataclass
class UidBlock:
    """The uids a local Substrate's sandboxes run as, held while it serves."""

    first: int
    #: The descriptor holding the block's lock (root only: see claim_uid_block).
    lock: int | None = None

    def slot(self, index: int) -> int:
        return self.first + 1 + index

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def claim_uid_block(root: Path) -> UidBlock:
    """The block for the state dir `root`: the one its path hashes to (the same across restarts,
    so its files keep their owners), else the next one no other server holds (a hash alone would
    give two of a few hundred state dirs the same block: birthday odds); never one whose uids the
    host has given out (`_host_ids`). Claimed, it is first emptied of leftover processes."""
    digest = int(hashlib.sha256(str(root).encode()).hexdigest()[:8], 16)
    if os.geteuid() != 0:
        return UidBlock(UID_FIRST + (digest % UID_BLOCKS) * UID_BLOCK)
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    taken = _host_ids()
    for step in range(UID_BLOCKS):
        first = UID_FIRST + ((digest + step) % UID_BLOCKS) * UID_BLOCK
        if any(ids.start < first + UID_BLOCK and first < ids.stop for ids in taken):
            continue
        lock = try_lock(UID_LOCKS / str(first))
        if lock is not None:
            _kill_leftovers(range(first, first + UID_BLOCK))
            return UidBlock(first, lock)
    raise RuntimeError(f"all {UID_BLOCKS} sandbox uid blocks are held by other local substrates")


def _host_ids() -> list[range]:
    """The ids this host has given out: its users and groups, and the subordinate ranges of its
    users' rootless containers (/etc/subuid, /etc/subgid often reach into the blocks' range). A
    block that overlaps one is someone else's: its uids must not run sandboxes, nor be killed."""
    taken = []
    for name, start, count in (("passwd", 2, None), ("group", 2, None), ("subuid", 1, 2), ("subgid", 1, 2)):
        try:
            lines = (ETC / name).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.split(":")
            try:
                first = int(fields[start])
                taken.append(range(first, first + (int(fields[count]) if count else 1)))
            except (IndexError, ValueError):
                continue  # a comment, or a line that names no id
    return taken


def running_as(uids: range) -> list[int]:
    """Every live (not zombie) process running as one of `uids`."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and _runs_as(int(name), uids)]


def _runs_as(pid: int, uids: range) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.partition(":")[::2] for line in status.splitlines())
        return fields["State"].split()[0] != "Z" and any(int(u) in uids for u in fields["Uid"].split())
    except (OSError, KeyError, IndexError, ValueError):
        return False  # gone meanwhile


def _kill_leftovers(uids: range) -> None:
    """SIGKILL every process still running as one of `uids`: a sandbox that outlived the server
    which held them (none should) must not share a uid with this server's sandboxes."""
    killed = []
    for pid in running_as(uids):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # Looked at again through the pidfd's process: a pid reused since is never signalled.
            if _runs_as(pid, uids):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed.append(str(pid))
        except ProcessLookupError:
            continue
        finally:
            os.close(pidfd)
    if killed:
        log.warning("killed %d processes left running as uids %d-%d by an earlier server: %s",
                    len(killed), uids.start, uids.stop - 1, " ".join(killed))  # fmt: skip


#: The dirs of a slot that a sandbox sees writable (tmp/ only at level none; `sock` lives apart).
SLOT_DIRS = ("workspace", "state", "tmp")


@dataclass
class SlotDirs:
    base: Path
    sock_dir: Path
    uid: int

    @property
    def workspace(self) -> Path:
        return self.base / "workspace"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def trash(self) -> Path:
        return self.base / "trash"

    def reset(self) -> None:
        """Empty every writable dir (the previous actor's files must not leak into the next).

        Each dir is first renamed into the slot's trash, which nothing left in it can prevent,
        so the slot starts clean even when deleting fails (see `prepare`)."""
        self.trash.mkdir(parents=True, exist_ok=True)
        for d in (self.base / n for n in SLOT_DIRS):
            with contextlib.suppress(FileNotFoundError):
                os.rename(d, self.trash / uuid.uuid4().hex)
        # Only the local Substrate writes here (it binds the sockets; no sandbox sees the dir), and
        # it may be on another file system than the trash (`Layout.sock_root`).
        remove_tree(str(self.sock_dir))
        self.prepare()

    def prepare(self) -> None:
        """Create the slot's dirs; delete its trash (at every reset, and at every server start)."""
        try:
            remove_tree(str(self.trash))
        except OSError as err:
            log.error("slot %s: cannot delete what an earlier actor left in %s (%s); trying again at "
                      "its next reset", self.base.name, self.trash, err)  # fmt: skip
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.workspace, self.state, self.tmp, self.sock_dir):
            d.mkdir(parents=True, exist_ok=True)
            _give(d, self.uid)

    def snapshot_sources(self) -> dict[str, Path]:
        return {"workspace": self.workspace, "state": self.state}


def _give(path: Path, uid: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, uid, uid)
    path.chmod(0o755)


@dataclass
class Slot:
    name: str
    dirs: SlotDirs
    #: Name of the actor occupying the slot ("" = free).
    actor: str = ""
    process: SandboxProcess | None = None
    #: Watches the sandbox for an unexpected exit (the local "worker pod died").
    watcher: asyncio.Task[None] | None = None
    #: True while a suspend stops the sandbox on purpose.
    stopping: bool = False
    #: True once that suspend has stopped (or frozen) every process of the sandbox, while it
    #: writes the snapshot: nothing runs, so the slot holds no running place (a resume of another
    #: actor may start meanwhile, in another slot), though it keeps its dirs.
    stilled: bool = False
    #: The actor is suspended with its sandbox stopped in this slot: its run id (the guest's
    #: socket path) and the snapshot written at that suspend (a resume continues the sandbox
    #: only if that is still the actor's latest).
    frozen: bool = False
    run_id: str = ""
    snapshot: str = ""
    #: True when the sandbox is gone but the dirs still hold files of its actor newer than its
    #: snapshot (`ActorRecord.held`) that could not be written yet (a host error): the slot is
    #: kept, and neither runs nor is handed out, until they are.
    holding: bool = False
    last_used: int = 0

    @property
    def running(self) -> bool:
        return bool(self.actor) and not self.frozen and not self.stilled and not self.holding

    @property
    def uid(self) -> int:
        return self.dirs.uid


class SlotPool:
    def __init__(self, layout: Layout, uids: UidBlock, count: int, frozen_max: int = 0) -> None:
        self.count = count
        self.slots = [
            Slot(f"slot-{i}", SlotDirs(layout.slot_dir(f"slot-{i}"), layout.socket_dir(f"slot-{i}"),
                                       uids.slot(i)))
            for i in range(min(count + frozen_max, UID_BLOCK - 1))
        ]  # fmt: skip
        self._by_name = {s.name: s for s in self.slots}
        self._clock = 0

    def get(self, name: str) -> Slot | None:
        return self._by_name.get(name)

    def claim(self, actor: str) -> Slot | None:
        """An empty slot for `actor`, or None when `count` run already or none is empty."""
        if self.busy >= self.count:
            return None
        free = [s for s in self.slots if not s.actor]
        if not free:
            return None
        slot = min(free, key=lambda s: s.last_used)
        slot.actor = actor
        return slot

    def freeze(self, slot: Slot, run_id: str, snapshot: str) -> None:
        """`slot`'s actor is suspended with its sandbox stopped there: its running place is free."""
        self._clock += 1
        slot.frozen, slot.run_id, slot.snapshot, slot.stopping = True, run_id, snapshot, False
        slot.stilled = False
        slot.last_used = self._clock

    def thaw(self, slot: Slot) -> None:
        slot.frozen, slot.snapshot = False, ""

    def frozen_of(self, actor: str) -> Slot | None:
        return next((s for s in self.slots if s.frozen and not s.stopping and s.actor == actor), None)

    def oldest_frozen(self) -> Slot | None:
        """The frozen sandbox to kill when a resume needs its slot (not one being killed already)."""
        frozen = [s for s in self.slots if s.frozen and not s.stopping]
        return min(frozen, key=lambda s: s.last_used) if frozen else None

    def release(self, slot: Slot) -> None:
        self._clock += 1
        slot.actor, slot.process, slot.watcher, slot.stopping, slot.stilled = "", None, None, False, False
        slot.frozen, slot.run_id, slot.snapshot, slot.holding = False, "", "", False
        slot.last_used = self._clock

    @property
    def busy(self) -> int:
        """Slots running an actor (frozen ones are not): `Slot.running`, inline (several times per
        resume, over every slot kept frozen as well)."""
        return sum(1 for s in self.slots if s.actor and not (s.frozen or s.stilled or s.holding))

    @property
    def can_freeze(self) -> bool:
        return len(self.slots) > self.count
