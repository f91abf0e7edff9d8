"""Path confinement: every path a tool takes resolves inside the workspace root.

A path is joined to the root (relative) or taken as is (absolute), normalised, and must stay
inside the root lexically; then symlinks are resolved and the real path must still be inside
the real root. Read-only tools may also read under the skills directory (activate_skill hands
out those paths). Callers open final components with O_NOFOLLOW where a swap could matter.
"""

from __future__ import annotations

import copy
import functools
import os

from guest.tools.base import ToolError


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class PathResolver:
    """Resolves tool paths against the workspace (writable) and extra read-only roots."""

    def __init__(self, workspace: str, read_only_roots: tuple[str, ...] = ()) -> None:
        self.root = os.path.realpath(workspace)
        self._read_only_given = read_only_roots

    def with_read_only(self, read_only_roots: tuple[str, ...]) -> PathResolver:
        """This workspace with other read-only roots, without resolving the workspace again
        (realpath is a syscall per component: a measurable part of a short tool call)."""
        clone = copy.copy(self)
        clone._read_only_given = read_only_roots
        clone.__dict__.pop("_read_only", None)
        return clone

    @functools.cached_property
    def _read_only(self) -> tuple[str, ...]:
        # Resolved on first use: most calls (a bash command in the workspace) never need them.
        return tuple(os.path.realpath(r) for r in self._read_only_given if r)

    def _roots(self, write: bool) -> tuple[str, ...]:
        return (self.root,) if write else (self.root, *self._read_only)

    def _lexical(self, path: object, arg: str, write: bool) -> str:
        if not isinstance(path, str) or not path:
            raise ToolError(f"'{arg}' must be a non-empty string")
        if "\0" in path:
            raise ToolError(f"'{arg}' contains a NUL byte")
        joined = os.path.normpath(path if os.path.isabs(path) else os.path.join(self.root, path))
        if not any(_inside(joined, r) for r in self._roots(write)):
            raise ToolError(f"path {path!r} is outside the workspace")
        return joined

    def resolve(self, path: object, arg: str = "path", write: bool = False) -> str:
        """The real path (symlinks resolved) of `path`, refused when it escapes the roots."""
        joined = self._lexical(path, arg, write)
        real = os.path.realpath(joined)
        if not any(_inside(real, r) for r in self._roots(write)):
            raise ToolError(f"path {path!r} resolves outside the workspace (symlink)")
        return real

    def resolve_entry(self, path: object, arg: str = "path", write: bool = False) -> str:
        """Like `resolve`, but the final component is kept as is (rm and stat act on a link itself)."""
        joined = self._lexical(path, arg, write)
        if joined in self._roots(write):
            return joined
        parent = os.path.realpath(os.path.dirname(joined))
        if not any(_inside(parent, r) for r in self._roots(write)):
            raise ToolError(f"path {path!r} resolves outside the workspace (symlink)")
        return os.path.join(parent, os.path.basename(joined))

    def display(self, real: str) -> str:
        """A path as the agent should see it: relative to the workspace when inside it."""
        if _inside(real, self.root):
            rel = os.path.relpath(real, self.root)
            return "." if rel == "." else rel
        return real
