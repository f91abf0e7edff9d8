"""Path confinement: every path a tool takes resolves inside the workspace root.

A path is joined to the root (relative) or taken as is (absolute), normalised, and must stay
inside the root lexically; then symlinks are resolved and the real path must still be inside
the real root. Read-only tools may also read under the skills directory (activate_skill hands
out those paths). Callers open final components with O_NOFOLLOW where a swap could matter.
"""

from __future__ import annotations

import functools
import os

from guest.tools.base import ToolError

#: What the kernel appends to a descriptor's /proc link once its file was unlinked.
_DELETED = " (deleted)"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def realpath(path: str) -> str:
    """`os.path.realpath(path)`, in three syscalls when the path exists.

    The kernel resolves the whole path in one open (O_PATH: no I/O, no side effects, even on a
    FIFO or device) and names what it found through /proc; os.path.realpath walks it with an
    lstat and a string join per component, the largest part of a short tool call. A path that
    does not exist (yet), cannot be searched, or names nothing /proc can show takes
    os.path.realpath, which resolves missing parts lexically exactly as before.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        real = ""
    finally:
        os.close(fd)
    if not real.startswith("/") or real.endswith(_DELETED):
        return os.path.realpath(path)
    return real


class PathResolver:
    """Resolves tool paths against the workspace (writable) and extra read-only roots."""

    def __init__(self, workspace: str, read_only_roots: tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(workspace)
        #: `root` with one trailing slash: what every path inside it starts with.
        self._prefix = self.root.rstrip("/") + "/"
        self._read_only_given = read_only_roots

    def with_read_only(self, read_only_roots: tuple[str, ...]) -> PathResolver:
        """This workspace with other read-only roots, without resolving the workspace again."""
        clone = PathResolver.__new__(PathResolver)
        clone.root, clone._prefix, clone._read_only_given = self.root, self._prefix, read_only_roots
        return clone

    @functools.cached_property
    def _read_only(self) -> tuple[str, ...]:
        # Resolved on first use: only a path outside the workspace needs them.
        return tuple(os.path.realpath(r) for r in self._read_only_given if r)

    def _allowed(self, path: str, write: bool) -> bool:
        """Whether `path` is inside the workspace, or (reading) inside a read-only root."""
        if path == self.root or path.startswith(self._prefix):
            return True
        return not write and any(_inside(path, r) for r in self._read_only)

    def _lexical(self, path: object, arg: str, write: bool) -> str:
        if not isinstance(path, str) or not path:
            raise ToolError(f"'{arg}' must be a non-empty string")
        if "\0" in path:
            raise ToolError(f"'{arg}' contains a NUL byte")
        joined = os.path.normpath(path if path.startswith("/") else self._prefix + path)
        if not self._allowed(joined, write):
            raise ToolError(f"path {path!r} is outside the workspace")
        return joined

    def resolve(self, path: object, arg: str = "path", write: bool = False) -> str:
        """The real path (symlinks resolved) of `path`, refused when it escapes the roots."""
        joined = self._lexical(path, arg, write)
        real = realpath(joined)
        if not self._allowed(real, write):
            raise ToolError(f"path {path!r} resolves outside the workspace (symlink)")
        return real

    def resolve_entry(self, path: object, arg: str = "path", write: bool = False) -> str:
        """Like `resolve`, but the final component is kept as is (rm and stat act on a link itself)."""
        joined = self._lexical(path, arg, write)
        if joined == self.root or (not write and joined in self._read_only):
            return joined
        parent = realpath(os.path.dirname(joined))
        if not self._allowed(parent, write):
            raise ToolError(f"path {path!r} resolves outside the workspace (symlink)")
        return os.path.join(parent, os.path.basename(joined))

    def display(self, real: str) -> str:
        """A path as the agent should see it: relative to the workspace when inside it."""
        if real == self.root:
            return "."
        if real.startswith(self._prefix):
            return real[len(self._prefix) :]
        return real
