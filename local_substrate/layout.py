"""Where the local Substrate keeps things under `<state_dir>/local-substrate/`.

    actors.db                 sqlite: actors and atespaces (store.py)
    status.json               written once serving: address, sandbox level, slots, pid
    lock                      flock held by the serving process (one server per state dir)
    snapshots/<actor_id>/     the actor's latest snapshot, <seq>.tar.zst (snapshots.py)
    golden/                   one baked snapshot per template, of its current setup (golden.py)
    slots/<slot>/             a slot's live dirs: workspace/, state/, tmp/ (level none's /tmp),
                              root/ (unshare mount point), trash/ (its last reset's leftovers)
    sock/<slot>/<uid>.sock    a guest incarnation's unix socket, bound here, passed in as an fd;
                              when this path is too long for a socket address, the sockets live
                              in /tmp/atefleet-<uid>/<hash of this dir>/ instead (routing.py)
    sandbox-etc/              the sandboxes' /etc: the allowed host entries, copied at start, and a
                              generated passwd and group (sandbox.write_etc)
    token                     the credential gRPC callers must present (0600; server.py)
    bake/                     scratch dirs of golden-snapshot baking
    empty/                    an empty dir mounted where a template has no skills
    logs/<slot>.log           the sandbox's stdout/stderr (host side only)

Nothing here is visible inside a sandbox except the one slot's workspace/ and state/ (and
sandbox-etc/, read-only, as /etc).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common.routing import guest_socket_root, local_guest_socket
from local_substrate.trees import remove_tree


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "actors.db"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def golden(self) -> Path:
        return self.root / "golden"

    @property
    def bake(self) -> Path:
        return self.root / "bake"

    @property
    def empty(self) -> Path:
        return self.root / "empty"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def slot_dir(self, slot: str) -> Path:
        return self.root / "slots" / slot

    @property
    def sandbox_etc(self) -> Path:
        return self.root / "sandbox-etc"

    @property
    def token(self) -> Path:
        return self.root / "token"

    @cached_property
    def sock_root(self) -> Path:
        return guest_socket_root(self.root)

    @property
    def sock_root_apart(self) -> bool:
        """Whether the sockets live outside the root (a state dir too deep for socket addresses)."""
        return not self.sock_root.is_relative_to(self.root.resolve())

    def socket(self, slot: str, run_id: str) -> Path:
        return local_guest_socket(self.sock_root, slot, run_id)

    def socket_dir(self, slot: str) -> Path:
        return self.sock_root / slot

    def create(self) -> None:
        for d in (self.root, self.snapshots, self.golden, self.bake, self.empty, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        # The root holds the fleet's actor data: only its owner may look inside.
        self.root.chmod(0o700)
        if self.sock_root_apart:
            _private_dir(self.sock_root.parent)
            _private_dir(self.sock_root)

    def remove_sockets_apart(self) -> None:
        """At a clean stop: the sockets dir outside the root goes (nothing else is in it)."""
        if self.sock_root_apart:
            remove_tree(str(self.sock_root))


def _private_dir(path: Path) -> None:
    """Make `path` a dir only this user can enter, refusing one that someone else made or a link
    (in a shared /tmp another user could have made it first to see or swap our sockets)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RuntimeError(f"{path} is not a dir of this user (uid {os.getuid()}): refusing to put "
                           "guest sockets there; remove it or choose a shorter state_dir")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
