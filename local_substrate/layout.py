"""Where the local Substrate keeps things under `<state_dir>/local-substrate/`.

    actors.db                 sqlite: actors and atespaces (store.py)
    status.json               written once serving: address, sandbox level, slots, pid
    lock                      flock held by the serving process (one server per state dir)
    snapshots/<actor_id>/     the actor's latest snapshot, <seq>.tar.zst (snapshots.py)
    golden/                   one baked snapshot per template, of its current setup (golden.py)
    slots/<slot>/             a slot's live dirs: workspace/, state/, tmp/ (level none's /tmp),
                              root/ (unshare mount point), trash/ (its last reset's leftovers)
    sock/<slot>/<uid>.sock    a guest incarnation's unix socket, bound here, passed in as an fd
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

from dataclasses import dataclass
from pathlib import Path

from common.routing import local_guest_socket


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

    def socket(self, slot: str, run_id: str) -> Path:
        return local_guest_socket(self.root, slot, run_id)

    def socket_dir(self, slot: str) -> Path:
        return local_guest_socket(self.root, slot, "").parent

    def create(self) -> None:
        for d in (self.root, self.snapshots, self.golden, self.bake, self.empty, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        # The root holds the fleet's actor data: only its owner may look inside.
        self.root.chmod(0o700)
