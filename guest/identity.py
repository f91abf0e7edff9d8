"""Which actor this guest serves: given by its launcher (`--actor`), else fixed by the first /v1
request.

The local Substrate always names the actor on the command line, so a request for any other actor
(a worker holding a stale address, a tenant's forged request) is refused, whoever talks first. A
container guest whose launcher cannot name it (Substrate proper selects the actor by Host header
at its router) binds on first contact instead; that binding is persisted in the state dir
(`actor`), so a restarted guest keeps it.
"""

from __future__ import annotations

import os


class ActorMismatch(Exception):
    def __init__(self, bound: str, got: str) -> None:
        super().__init__(f"guest serves actor {bound!r}, not {got!r}")
        self.bound = bound
        self.got = got


class ActorIdentity:
    def __init__(self, state_dir: str, given: str | None) -> None:
        self._path = os.path.join(state_dir, "actor")
        self.actor: str | None = given
        self.given = given is not None
        if given is None:
            try:
                with open(self._path) as f:
                    self.actor = f.read().strip() or None
            except FileNotFoundError:
                pass

    def check(self, actor: str) -> None:
        """Raise ActorMismatch unless `actor` is the one served (binding it first if none is)."""
        if self.actor is None:
            self._bind(actor)
        elif self.actor != actor:
            raise ActorMismatch(self.actor, actor)

    def _bind(self, actor: str) -> None:
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            f.write(actor)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self.actor = actor
