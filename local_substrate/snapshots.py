"""Workspace snapshots: tar + zstd files of what a tenant left in its slot, written atomically.

A snapshot holds a slot's `workspace/` and the guest's `state/` (its journal and session binding
must survive a suspend, or a re-delivered job would run twice). Only data survives: processes do
not. Writes go to a temp file that is fsynced and renamed into place, so a crash leaves either
the old snapshot or the new one, never a torn file.

Both directions walk the tenant's tree with `trees` (iterative, fd-relative, no link followed):
- writing keeps regular files, dirs and symlinks (pointing anywhere: they are never followed);
  FIFOs, sockets and devices are dropped and returned to the caller, who reports them; the
  data regions of a sparse file are stored with their map (a pax record), never its holes;
  limits on bytes, entries and depth make an oversized tree `SnapshotRefused` before it is read;
- restoring creates each member relative to its parent dir's fd with `O_NOFOLLOW | O_EXCL`, so
  no member can reach outside the slot (no absolute names, no `..`, no path through a link), keeps
  only regular files, dirs, symlinks and hard links inside the archive, strips setuid/setgid/sticky
  bits and gives everything to the uid of the slot that restores it. This is our own filter: the
  stdlib's `extraction_filter` needs Python 3.11.4, Debian 12 has 3.11.2.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tarfile
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import zstandard

from common.config import TemplateLimits
from local_substrate.trees import Entry, TreeTooLarge, climb, open_dir, own_access, remove_tree, walk

log = logging.getLogger(__name__)

#: zstd level: 1 is fastest and workspaces are mostly small; suspend latency matters more than size.
ZSTD_LEVEL = 1
#: Members of a snapshot archive and the slot dirs they come from.
PARTS = ("workspace", "state")
#: Bytes per read/write when restoring file data (tarfile's 16 KiB costs more system time). Not
#: used when writing: tarfile's stream buffer re-slices whatever it is given in 10 KiB records,
#: so larger writes into it cost quadratic copying.
COPY_CHUNK = 256 << 10
#: Pax records of a sparse file: its real size, and its data regions as "offset,length,...".
SPARSE_SIZE = "ATEFLEET.sparse.size"
SPARSE_MAP = "ATEFLEET.sparse.map"
#: A file is stored sparse when its holes save at least this many bytes ...
SPARSE_MIN_SAVING = 1 << 20
#: ... and it has at most this many data regions (else its map would be the size problem).
SPARSE_MAX_REGIONS = 4096
#: Open flags of a tenant's file we read: never through a link, never blocking on a FIFO.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Errors of the host rather than of the tree (a full disk...): a snapshot failing with one is
#: worth retrying once the host recovers.
HOST_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
#: Errors that make one member of an archive unrestorable (it is skipped, the rest restored).
MEMBER_ERRNOS = (errno.ELOOP, errno.ENOTDIR, errno.EEXIST, errno.ENOENT)


class SnapshotRefused(Exception):
    """The tree is over a snapshot limit: nothing was written."""


@dataclass(frozen=True)
class SnapshotLimits:
    """What one snapshot may hold (per template): data bytes, files+dirs+links, dir depth."""

    max_bytes: int
    max_entries: int
    max_depth: int

    @classmethod
    def of(cls, limits: TemplateLimits) -> SnapshotLimits:
        return cls(limits.workspace_mb << 20, limits.workspace_entries, limits.workspace_depth)


def write_snapshot(dest: Path, sources: dict[str, Path], limits: SnapshotLimits) -> list[str]:
    """Archive each `sources[name]` dir under `name/` into `dest` atomically.

    Returns the archive paths of the special files left out. SnapshotRefused (and nothing
    written) when the tree is over `limits`.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        dropped = _write(tmp, sources, limits)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    _fsync_dir(dest.parent)
    return dropped


def _write(tmp: Path, sources: dict[str, Path], limits: SnapshotLimits) -> list[str]:
    writer = _Writer(limits)
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    with open(tmp, "wb") as raw, cctx.stream_writer(raw, closefd=False) as zw:
        with tarfile.open(fileobj=zw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for name, src in sources.items():
                writer.add_tree(tar, name, src)
        zw.flush(zstandard.FLUSH_FRAME)
        raw.flush()
        os.fsync(raw.fileno())
    return writer.dropped


class _Tally:
    """Counts trees against one set of limits (across all parts): SnapshotRefused past one."""

    def __init__(self, limits: SnapshotLimits) -> None:
        self.limits = limits
        self.bytes = 0
        self.entries = 0

    def entries_of(self, part: str, src: Path) -> Generator[Entry, None, None]:
        """Each entry under `src` (the caller closes the iterator: it holds the walk's fds)."""
        left = self.limits.max_entries - self.entries
        try:
            with contextlib.closing(walk(str(src), left)) as entries:
                for entry in entries:
                    self.entries += 1
                    if entry.depth > self.limits.max_depth:
                        raise SnapshotRefused(
                            f"{part}/ is deeper than {self.limits.max_depth} dirs (the template's limit)"
                        )
                    yield entry
        except TreeTooLarge:
            raise SnapshotRefused(
                f"more than {self.limits.max_entries} files, dirs and links (the template's limit)"
            ) from None

    def add_bytes(self, path: str, stored: int) -> None:
        if self.bytes + stored > self.limits.max_bytes:
            raise SnapshotRefused(
                f"more than {self.limits.max_bytes >> 20} MB of data (the template's limit; "
                f"{path} alone holds {stored >> 20} MB)"
            )
        self.bytes += stored


@dataclass(frozen=True)
class Usage:
    """What a snapshot of a tree would hold: data bytes, and files+dirs+links; what it would leave
    out (special files), and how many files it could read only by adding owner read to their mode."""

    bytes: int
    entries: int
    special: int = 0
    unreadable: int = 0

    @property
    def exact(self) -> bool:
        """Whether a snapshot would keep the tree as it is: nothing left out, no mode changed."""
        return not self.special and not self.unreadable


def measure(sources: dict[str, Path], limits: SnapshotLimits) -> Usage:
    """What a snapshot of `sources` would hold, from lstats alone (no file is opened); the same
    limits as `write_snapshot`, so SnapshotRefused past one. Safe on a running sandbox's tree (the
    disk guard's use): TreeChanged when the tenant moved a dir the walk was in."""
    tally = _Tally(limits)
    special = unreadable = 0
    # Root reads every file; a normal user's fleet owns its sandboxes' files but needs their mode.
    needs_mode = os.geteuid() != 0
    for part, src in sources.items():
        with contextlib.closing(tally.entries_of(part, src)) as entries:
            for entry in entries:
                mode = entry.st.st_mode
                if stat.S_ISREG(mode):
                    tally.add_bytes(f"{part}/{entry.path}", stored_bytes(entry.st))
                    if needs_mode and not mode & stat.S_IRUSR:
                        unreadable += 1
                elif not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
                    special += 1
    return Usage(tally.bytes, tally.entries, special, unreadable)


def stored_bytes(st: os.stat_result) -> int:
    """A regular file's data as a snapshot stores it, judged from its lstat: a file whose holes
    save SPARSE_MIN_SAVING counts its allocated blocks (a snapshot keeps only its data regions)."""
    allocated = st.st_blocks * 512
    return st.st_size if st.st_size - allocated < SPARSE_MIN_SAVING else allocated


class _Writer:
    """Adds trees to an archive within one set of limits (counted across all parts)."""

    def __init__(self, limits: SnapshotLimits) -> None:
        self.tally = _Tally(limits)
        self.dropped: list[str] = []

    def add_tree(self, tar: tarfile.TarFile, part: str, src: Path) -> None:
        with contextlib.closing(self.tally.entries_of(part, src)) as entries:
            for entry in entries:
                self._add(tar, f"{part}/{entry.path}", entry.name, entry.dir_fd, entry.st)
                _forget_members(tar)

    def _add(self, tar: tarfile.TarFile, path: str, name: str, dir_fd: int, st: os.stat_result) -> None:
        info = tarfile.TarInfo(path)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
            tar.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            self._add_file(tar, info, name, dir_fd)
        else:
            self.dropped.append(path)

    def _add_file(self, tar: tarfile.TarFile, info: tarfile.TarInfo, name: str, dir_fd: int) -> None:
        fd = _open_file(name, dir_fd)
        with open(fd, "rb", buffering=0) as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.dropped.append(info.name)
                return
            regions = _sparse_regions(fd, st)
            stored = sum(n for _, n in regions) if regions is not None else st.st_size
            self.tally.add_bytes(info.name, stored)
            info.size = stored
            if regions is None:
                tar.addfile(info, f)
                return
            info.pax_headers = {
                SPARSE_SIZE: str(st.st_size),
                SPARSE_MAP: ",".join(f"{off},{n}" for off, n in regions),
            }
            tar.addfile(info, _RegionReader(fd, regions))


def _open_file(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        own_access(name, dir_fd, 0o400)
        return os.open(name, READ_FLAGS, dir_fd=dir_fd)


def _sparse_regions(fd: int, st: os.stat_result) -> list[tuple[int, int]] | None:
    """The data regions of a file whose holes are worth skipping; None to store it whole."""
    if st.st_size - st.st_blocks * 512 < SPARSE_MIN_SAVING:
        return None
    regions: list[tuple[int, int]] = []
    offset = 0
    while offset < st.st_size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), st.st_size)
        regions.append((start, end - start))
        if len(regions) > SPARSE_MAX_REGIONS:
            return None
        offset = end
    os.lseek(fd, 0, os.SEEK_SET)
    return regions


def _forget_members(tar: tarfile.TarFile) -> None:
    """Drop the members tarfile keeps of every entry it read or wrote (a workspace may have very
    many). `members` is not in typeshed's TarFile, hence the ignore."""
    tar.members.clear()  # type: ignore[attr-defined]


class _RegionReader:
    """The data regions of a sparse file, one after another (what tarfile copies into the archive)."""

    def __init__(self, fd: int, regions: list[tuple[int, int]]) -> None:
        self._fd = fd
        self._regions = list(reversed(regions))

    def read(self, size: int = -1, /) -> bytes:
        if size < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        while self._regions:
            offset, length = self._regions[-1]
            if length == 0:
                self._regions.pop()
                continue
            data = os.pread(self._fd, min(size, length), offset)
            if not data:
                raise OSError(errno.EIO, "sparse file shrank while it was archived")
            self._regions[-1] = (offset + len(data), length - len(data))
            return data
        return b""


def restore_snapshot(src: Path, dests: dict[str, Path], uid: int, gid: int) -> None:
    """Extract `src` so that member `name/...` lands in `dests[name]`, owned by uid:gid (as root)."""
    owner = (uid, gid) if os.geteuid() == 0 else None
    dctx = zstandard.ZstdDecompressor()
    with open(src, "rb") as raw, dctx.stream_reader(raw) as zr:
        with tarfile.open(fileobj=zr, mode="r|") as tar, contextlib.closing(_Extractor(dests, owner)) as ex:
            for member in tar:
                ex.add(tar, member)
                _forget_members(tar)
            ex.finish()
    if ex.skipped:
        log.warning("snapshot %s: %d member(s) skipped, e.g. %r", src, len(ex.skipped), ex.skipped[:3])


_BAD_COMPONENTS = frozenset(("", ".", ".."))


def _common_depth(a: list[str], b: list[str]) -> int:
    """How many leading components `a` and `b` share. Consecutive members are a dir and its
    child, or (setting dir modes, deepest first) a dir and its parent: those are list compares,
    so a tree thousands of levels deep is not quadratic in Python steps."""
    if a[: len(b)] == b:
        return len(b)
    if b[: len(a)] == a:
        return len(a)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _split(name: str, parts: dict[str, Path]) -> tuple[str, list[str]] | None:
    """(part, components) of an archive name, or None if it could leave its part's dir."""
    comps = name.split("/")
    if comps[0] not in parts or not _BAD_COMPONENTS.isdisjoint(comps[1:]):
        return None
    return comps[0], comps[1:]


class _Extractor:
    """Creates members relative to one open dir at a time, moving between dirs like `trees.walk`."""

    def __init__(self, roots: dict[str, Path], owner: tuple[int, int] | None) -> None:
        self._roots = roots
        self._owner = owner
        self._part = ""
        self._at: list[str] = []
        self._fd = -1
        #: (part, components, mode, mtime) of each dir: set last, deepest first, once its
        #: children exist (a mode-000 dir must not lock us out while we fill it).
        self._dirs: list[tuple[str, list[str], int, int]] = []
        self.skipped: list[str] = []

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _go(self, part: str, comps: list[str]) -> int:
        """The fd of dir `comps` of `part` (each step opened without following a link)."""
        if part != self._part:
            self.close()
            self._fd, self._part, self._at = open_dir(str(self._roots[part]), None), part, []
        common = _common_depth(self._at, comps)
        while len(self._at) > common:
            self._fd = climb(self._fd)
            self._at.pop()
        for c in comps[common:]:
            child = open_dir(c, self._fd)
            os.close(self._fd)
            self._fd = child
            self._at.append(c)
        return self._fd

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        where = _split(member.name, self._roots)
        if where is None or not where[1]:
            if where is None:
                self.skipped.append(member.name)
            return
        part, comps = where
        try:
            self._create(tar, member, part, comps)
        except OSError as err:
            if err.errno not in MEMBER_ERRNOS:
                raise
            self.skipped.append(member.name)

    def _create(self, tar: tarfile.TarFile, member: tarfile.TarInfo, part: str, comps: list[str]) -> None:
        fd, name, mode = self._go(part, comps[:-1]), comps[-1], member.mode & 0o777
        if member.isdir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            self._chown(name, fd)
            self._dirs.append((part, comps, mode, int(member.mtime)))
        elif member.isreg():
            self._write_file(tar, member, name, fd, mode)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=fd)
            self._chown(name, fd)
        elif member.islnk():
            self._link(member, name, fd)
        else:
            self.skipped.append(member.name)

    def _chown(self, name: str, fd: int) -> None:
        if self._owner is not None:
            os.chown(name, *self._owner, dir_fd=fd, follow_symlinks=False)

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, dir_fd: int,
                    mode: int) -> None:  # fmt: skip
        src = tar.extractfile(member)
        if src is None:
            raise OSError(errno.ENOENT, "no data", member.name)
        regions, size = _regions_of(member)
        fd = os.open(name, WRITE_FLAGS, 0o600, dir_fd=dir_fd)
        with open(fd, "wb", buffering=0) as out:
            for offset, length in regions:
                out.seek(offset)
                _copy(src, out, length)
            out.truncate(size)
            if self._owner is not None:
                os.fchown(fd, *self._owner)
            os.fchmod(fd, mode)
            os.utime(fd, (member.mtime, member.mtime))

    def _link(self, member: tarfile.TarInfo, name: str, dir_fd: int) -> None:
        """A hard link to an earlier member (archives written by tarfile's `add` have them)."""
        target = _split(member.linkname, self._roots)
        if target is None or not target[1] or target[0] != self._part:
            raise OSError(errno.ENOENT, "hard link outside its part", member.name)
        src_fd = open_dir(str(self._roots[target[0]]), None)
        try:
            for c in target[1][:-1]:
                child = open_dir(c, src_fd)
                os.close(src_fd)
                src_fd = child
            os.link(target[1][-1], name, src_dir_fd=src_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            os.close(src_fd)

    def finish(self) -> None:
        for part, comps, mode, mtime in reversed(self._dirs):
            fd = self._go(part, comps[:-1])
            os.utime(comps[-1], (mtime, mtime), dir_fd=fd, follow_symlinks=False)
            os.chmod(comps[-1], mode, dir_fd=fd)


def _regions_of(member: tarfile.TarInfo) -> tuple[list[tuple[int, int]], int]:
    """Where a member's data goes in its file, and the file's size (a sparse one has holes)."""
    raw = member.pax_headers.get(SPARSE_MAP)
    if raw is None:
        return [(0, member.size)], member.size
    numbers = [int(x) for x in raw.split(",")] if raw else []
    regions = list(zip(numbers[::2], numbers[1::2], strict=True))
    size = int(member.pax_headers[SPARSE_SIZE])
    if sum(n for _, n in regions) != member.size or any(o < 0 or n < 0 or o + n > size for o, n in regions):
        raise OSError(errno.ENOENT, "inconsistent sparse map", member.name)
    return regions, size


def _copy(src: IO[bytes], out: IO[bytes], length: int) -> None:
    while length > 0:
        chunk = src.read(min(COPY_CHUNK, length))
        if not chunk:
            raise OSError(errno.EIO, "archive ended inside a file")
        out.write(chunk)
        length -= len(chunk)


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

    def write(self, path: Path, sources: dict[str, Path], limits: SnapshotLimits) -> list[str]:
        return write_snapshot(path, sources, limits)

    def prune(self, actor_uid: str, keep: str) -> None:
        """Delete the actor's files other than `keep` (the snapshot now recorded as latest):
        superseded snapshots and the temp files of writes that failed or were cut by a crash."""
        for p in (self.root / actor_uid).iterdir():
            if str(p) != keep:
                p.unlink(missing_ok=True)

    def delete_actor(self, actor_uid: str) -> None:
        remove_tree(str(self.root / actor_uid))

    def collect(self, latest: dict[str, str]) -> None:
        """After a restart: drop the dirs of actors that no longer exist (`latest`: uid -> the
        snapshot each live actor restores from) and every file no actor restores from."""
        if not self.root.is_dir():
            return
        for d in self.root.iterdir():
            if d.name in latest:
                self.prune(d.name, latest[d.name])
            else:
                log.info("deleting the snapshots of a deleted actor: %s", d)
                remove_tree(str(d))
