"""Workspace snapshots: tar + zstd files, written atomically, restored with a safe filter.

A snapshot holds a slot's `workspace/` and the guest's `state/` (its journal and session binding
must survive a suspend, or a re-delivered job would run twice). Only data survives: processes do
not. Writes go to a temp file that is fsynced and renamed into place, so a crash leaves either
the old snapshot or the new one, never a torn file. Restores run the stdlib `data` filter (no
absolute paths, no links out of the tree, no devices, no setuid bits) and give every file to the
uid of the slot that restores it.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from pathlib import Path

import zstandard

#: zstd level: 1 is fastest and workspaces are mostly small; suspend latency matters more than size.
ZSTD_LEVEL = 1
#: Members of a snapshot archive and the slot dirs they come from.
PARTS = ("workspace", "state")


def write_snapshot(dest: Path, sources: dict[str, Path]) -> None:
    """Archive each `sources[name]` dir under `name/` into `dest` atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    with open(tmp, "wb") as raw, cctx.stream_writer(raw, closefd=False) as zw:
        with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name, src in sources.items():
                tar.add(src, arcname=name, recursive=True)
        zw.flush(zstandard.FLUSH_FRAME)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)


def restore_snapshot(src: Path, dests: dict[str, Path], uid: int, gid: int) -> None:
    """Extract `src` so that member `name/...` lands in `dests[name]`, owned by uid:gid."""
    own = os.geteuid() == 0

    def owned(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        checked = _safe(member, path)
        if checked is None or checked.name.split("/", 1)[0] not in dests:
            return None
        return checked.replace(uid=uid, gid=gid, uname="", gname="") if own else checked

    dctx = zstandard.ZstdDecompressor()
    root = _common_parent(dests)
    with open(src, "rb") as raw, dctx.stream_reader(raw) as zr:
        with tarfile.open(fileobj=zr, mode="r|") as tar:
            tar.extractall(root, filter=owned, numeric_owner=True)


def _safe(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """The `data` filter, except that symlinks may point anywhere (a venv in a workspace has
    absolute ones). That is safe: the filter still refuses any member whose real path on disk
    would leave the destination, so nothing is ever written through such a link."""
    try:
        return tarfile.data_filter(member, path)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        if member.issym():
            return tarfile.tar_filter(member, path)
        raise


def _common_parent(dests: dict[str, Path]) -> Path:
    """All destinations must be `<parent>/<name>` (a slot dir): extraction happens at the parent."""
    parents = {d.parent for d in dests.values()}
    if len(parents) != 1 or any(d.name != n for n, d in dests.items()):
        raise ValueError(f"snapshot destinations must be siblings named after their parts: {dests}")
    return parents.pop()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotStore:
    """Snapshots of each actor under `root/<actor uid>/`; only the latest is kept."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def new_path(self, actor_uid: str) -> Path:
        # Time-ordered names: a newer snapshot never overwrites the one still recorded as latest.
        return self.root / actor_uid / f"{time.time_ns():020d}.tar.zst"

    def write(self, path: Path, sources: dict[str, Path]) -> None:
        write_snapshot(path, sources)

    def prune(self, actor_uid: str, keep: str) -> None:
        """Delete the actor's snapshots other than `keep` (the one now recorded as latest)."""
        for p in (self.root / actor_uid).glob("*.tar.zst"):
            if str(p) != keep:
                p.unlink(missing_ok=True)

    def delete_actor(self, actor_uid: str) -> None:
        shutil.rmtree(self.root / actor_uid, ignore_errors=True)
