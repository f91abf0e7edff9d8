"""Session binding: the guest serves exactly one session, fixed by the first /v1 request.

The binding is persisted in the state dir (`session`), so a restarted guest keeps it.
"""

from __future__ import annotations

import os


class SessionMismatch(Exception):
    def __init__(self, bound: str, got: str) -> None:
        super().__init__(f"guest is bound to session {bound!r}, not {got!r}")
        self.bound = bound
        self.got = got


class SessionBinding:
    def __init__(self, state_dir: str) -> None:
        self._path = os.path.join(state_dir, "session")
        try:
            with open(self._path) as f:
                self.session: str | None = f.read().strip() or None
        except FileNotFoundError:
            self.session = None

    def check(self, session: str) -> None:
        """Bind on first contact; raise SessionMismatch for any other session afterwards."""
        if self.session is None:
            self._bind(session)
        elif self.session != session:
            raise SessionMismatch(self.session, session)

    def _bind(self, session: str) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(session)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self.session = session
