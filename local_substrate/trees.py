"""Walking and deleting trees a tenant wrote: iterative, relative to one open dir, never following links.

Everything under a slot's dirs is the tenant's: trees deeper than PATH_MAX or the recursion limit,
dirs and files of mode 000, names with any bytes, symlinks to anywhere, FIFOs and devices. So:

- no recursion: an explicit stack of the names still to visit, one list per open level;
- one dir fd at a time: every name is opened relative to its parent's fd (no path ever longer than
  one name), and the walk climbs back with `..`. Each dir's identity (device, inode) is kept, and
  a `..` that is not the dir the walk came from (the tenant moved a dir the walk was in) ends the
  walk with `TreeChanged`: a walk of a running sandbox's tree (the disk guard's) never leaves it.
  A name that vanished or changed kind between its lstat and its open is skipped;
- never a symlink followed (`O_NOFOLLOW`, `follow_symlinks=False`), never a FIFO opened (the
  caller looks at the lstat first);
- an unreadable dir of our own uid (a non-root fleet: the tenant runs as the fleet's uid) gets its
  owner bits back before it is opened; root needs no such help.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Generator
from contextvars import ContextVar
from dataclasses import dataclass

#: Open flags for a dir we descend into.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Names listed per batch while deleting (a dir of millions of names never sits in memory at once).
REMOVE_BATCH = 4096


class TreeTooLarge(Exception):
    """The tree has more entries than the caller allows."""


class TreeChanged(Exception):
    """A dir the walk was in moved meanwhile: `..` is no longer the dir it came from."""


@dataclass(frozen=True)
class Entry:
    """One name met by `walk`; `dir_fd` (its parent) is only valid until the walk moves on."""

    path: str
    name: str
    dir_fd: int
    depth: int
    st: os.stat_result


def open_dir(name: str, dir_fd: int | None) -> int:
    """Open a dir without following a link; give the owner rwx first if it refused us."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        own_access(name, dir_fd, 0o700)
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


#: Where `own_access` notes the names whose mode it changed, while set (a snapshot of a sandbox
#: kept frozen: the tree it continues must be the tree it left).
MODES_CHANGED: ContextVar[list[str] | None] = ContextVar("MODES_CHANGED", default=None)


def own_access(name: str, dir_fd: int | None, bits: int) -> None:
    """Add owner permission `bits` to `name` if it is a dir or regular file. The inode is pinned
    first (O_PATH, not following a link) and changed through that fd: a tenant that swaps the
    name for a link between the check and the change (a running sandbox's tree) changes nothing."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | bits)
            changed = MODES_CHANGED.get()
            if changed is not None:
                changed.append(name)
    finally:
        os.close(fd)


def _names(fd: int, limit: int) -> list[str]:
    """Up to `limit` names of the dir `fd` (reversed, so `pop()` visits them in listing order)."""
    names: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            if len(names) >= limit:
                break
            names.append(entry.name)
    names.reverse()
    return names


def climb(fd: int) -> int:
    """The parent of the dir `fd` (which is closed)."""
    parent = os.open("..", DIR_FLAGS, dir_fd=fd)
    os.close(fd)
    return parent


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


#: Errors of opening a name the lstat saw as a dir: it vanished, or became a file or a link.
_GONE = (FileNotFoundError, NotADirectoryError)


def _descend(name: str, fd: int, st: os.stat_result) -> int | None:
    """The fd of the dir `name` in `fd` if it is still the one lstat saw, else None (skipped)."""
    try:
        child = open_dir(name, fd)
    except _GONE:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # replaced by a symlink meanwhile
            return None
        raise
    if _identity(os.fstat(child)) != _identity(st):
        os.close(child)
        return None
    return child


def walk(root: str, max_entries: int) -> Generator[Entry, None, None]:
    """Every name under `root`, parents before children; TreeTooLarge past `max_entries`.

    A dir's own entry comes first; the walk then descends into it. A caller that must not go
    deeper raises instead of taking the next entry. TreeChanged when a dir moved under the walk.
    """
    fd = open_dir(root, None)
    # The identity of each open level's dir: idents[-1] is the dir `fd` stands in.
    idents = [_identity(os.fstat(fd))]
    stack = [_names(fd, max_entries + 1)]
    prefix: list[str] = []
    seen = 0
    try:
        while stack:
            if not stack[-1]:
                stack.pop()
                if prefix:
                    prefix.pop()
                    idents.pop()
                    fd = climb(fd)
                    if _identity(os.fstat(fd)) != idents[-1]:
                        raise TreeChanged("a dir moved while it was walked")
                continue
            name = stack[-1].pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            seen += 1
            if seen > max_entries:
                raise TreeTooLarge(f"more than {max_entries} files, dirs and links")
            yield Entry("/".join((*prefix, name)), name, fd, len(prefix) + 1, st)
            if stat.S_ISDIR(st.st_mode):
                child = _descend(name, fd, st)
                if child is None:
                    continue
                os.close(fd)
                fd = child
                prefix.append(name)
                idents.append(_identity(st))
                stack.append(_names(fd, max_entries - seen + 1))
    finally:
        os.close(fd)


def _writable_then(fd: int, remove: Callable[..., None], name: str) -> None:
    """`remove(name, dir_fd=fd)`; if the dir `fd` refused it (no write bit), give its owner rwx once."""
    try:
        remove(name, dir_fd=fd)
    except PermissionError:
        os.fchmod(fd, 0o700)
        remove(name, dir_fd=fd)


def remove_tree(root: str) -> None:
    """Delete `root` and everything in it, whatever its modes and depth (missing: nothing to do)."""
    try:
        fd = open_dir(root, None)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(root)
        return
    # Each level: (its name in its parent, names still to delete); "" for the root itself.
    stack: list[tuple[str, list[str]]] = [("", _names(fd, REMOVE_BATCH))]
    try:
        while stack:
            here, names = stack[-1]
            if not names:
                names.extend(_names(fd, REMOVE_BATCH))
            if not names:
                stack.pop()
                if here:
                    fd = climb(fd)
                    _writable_then(fd, os.rmdir, here)
                continue
            name = names.pop()
            try:
                _writable_then(fd, os.unlink, name)
            except IsADirectoryError:
                child = open_dir(name, fd)
                os.close(fd)
                fd = child
                stack.append((name, _names(fd, REMOVE_BATCH)))
            except FileNotFoundError:
                pass
    finally:
        os.close(fd)
    os.rmdir(root)
