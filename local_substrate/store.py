"""The local Substrate's persisted state: actors and atespaces in one sqlite file.

Every change is one committed transaction, so a restart of the server (a crash of its process
included) sees exactly the last acknowledged state. Commits are synchronous=FULL (on disk before
they return) except the status changes of a resume or park that point at no new snapshot
(`update(durable=False)`, NORMAL: written to the WAL at once, on disk at the next FULL commit or
checkpoint): only a power loss or kernel crash can roll those back, and recovery then sees the
operation as not done, or not finished, which it handles like any other. A commit that points an
actor at a new snapshot is always FULL, and the snapshot it replaces is deleted only after it.

Updates are optimistic on `version`: a writer that read an older version gets `VersionConflict`
(the API answers ABORTED "concurrent update conflict").
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path


class Status(IntEnum):
    """Actor.Status wire values (SUBSTRATE_CONTROL.md)."""

    UNSPECIFIED = 0
    RESUMING = 1
    RUNNING = 2
    SUSPENDING = 3
    SUSPENDED = 4
    PAUSING = 5
    PAUSED = 6


class VersionConflict(Exception):
    pass


@dataclass(frozen=True)
class ActorRecord:
    atespace: str
    name: str
    template_namespace: str
    template_name: str
    status: Status = Status.SUSPENDED
    version: int = 1
    #: Internal id: names its snapshot dir, so a re-created name never sees old snapshots.
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The slot it occupies while RESUMING/RUNNING/SUSPENDING/PAUSING ("" otherwise).
    slot: str = ""
    #: Identity of the current run (a new one per resume), reported as the pod uid.
    run_id: str = ""
    #: Path of the latest snapshot ("" = none yet).
    snapshot: str = ""
    selector: dict[str, str] = field(default_factory=dict)
    #: Archive paths of the special files (FIFOs, sockets, devices) the latest snapshot left out:
    #: reported on every suspend answer until the next snapshot.
    dropped: tuple[str, ...] = ()
    #: Why the disk guard stopped its last run (over its template's limits while the disk was
    #: low), or why files it held could not be kept; answered once, by the next resume, then
    #: cleared ("" = nothing to report).
    breach: str = ""
    #: The slot whose dirs hold files newer than `snapshot` ("" = `snapshot` is its latest): set
    #: by a fleet's park that kept the sandbox frozen without writing one (Control._suspend), kept
    #: while the actor runs on there, cleared once a snapshot is written from that slot.
    held: str = ""

    def evolve(self, **changes: object) -> ActorRecord:
        """A copy with `changes` and the next version."""
        return replace(self, version=self.version + 1, **changes)  # type: ignore[arg-type]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS atespaces (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS actors (
    atespace TEXT NOT NULL, name TEXT NOT NULL, template_namespace TEXT NOT NULL,
    template_name TEXT NOT NULL, status INTEGER NOT NULL, version INTEGER NOT NULL,
    uid TEXT NOT NULL, slot TEXT NOT NULL, run_id TEXT NOT NULL, snapshot TEXT NOT NULL,
    selector TEXT NOT NULL, dropped TEXT NOT NULL DEFAULT '[]', breach TEXT NOT NULL DEFAULT '',
    held TEXT NOT NULL DEFAULT '', PRIMARY KEY (atespace, name));
"""
#: Columns added after the first release, with their definitions (added to older files on open).
_ADDED_COLUMNS = {
    "dropped": "TEXT NOT NULL DEFAULT '[]'",
    "breach": "TEXT NOT NULL DEFAULT ''",
    "held": "TEXT NOT NULL DEFAULT ''",
}
_COLUMNS = (
    "atespace, name, template_namespace, template_name, status, version, uid, slot, run_id, snapshot, "
    "selector, dropped, breach, held"
)
_PLACEHOLDERS = ",".join("?" * len(_COLUMNS.split(",")))
_UPDATE = f"UPDATE actors SET ({_COLUMNS}) = ({_PLACEHOLDERS}) WHERE atespace=? AND name=? AND version=?"


def _row(r: ActorRecord) -> tuple[object, ...]:
    return (
        r.atespace, r.name, r.template_namespace, r.template_name, int(r.status), r.version,
        r.uid, r.slot, r.run_id, r.snapshot, json.dumps(r.selector, sort_keys=True), json.dumps(r.dropped),
        r.breach, r.held,
    )  # fmt: skip


def _record(row: tuple[object, ...]) -> ActorRecord:
    a, n, tns, tn, st, v, uid, slot, run, snap, sel, dropped, breach, held = row
    return ActorRecord(
        atespace=str(a), name=str(n), template_namespace=str(tns), template_name=str(tn),
        status=Status(int(str(st))), version=int(str(v)), uid=str(uid), slot=str(slot),
        run_id=str(run), snapshot=str(snap), selector=json.loads(str(sel)),
        dropped=tuple(json.loads(str(dropped))), breach=str(breach), held=str(held),
    )  # fmt: skip


class Store:
    """Synchronous sqlite access; each call is sub-millisecond, so callers use it inline.

    Every actor is also kept in memory, written through: this server is the file's only user
    (it holds the state dir's lock), so a read (several per resume or suspend) needs no query.
    The file is read once, at open. Two connections, so that a commit without waiting for the
    disk needs no switching of `synchronous` back and forth: `_db` commits FULL, `_quick` NORMAL.
    """

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        present = {str(r[1]) for r in self._db.execute("PRAGMA table_info(actors)")}
        for column, definition in _ADDED_COLUMNS.items():
            if column not in present:
                self._db.execute(f"ALTER TABLE actors ADD COLUMN {column} {definition}")
        self._quick = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._quick.execute("PRAGMA synchronous=NORMAL")
        self._actors: dict[tuple[str, str], ActorRecord] = {}
        #: Name → (atespace, name): names are unique across atespaces (Control.create_actor).
        self._names: dict[str, tuple[str, str]] = {}
        for rec in map(_record, self._db.execute(f"SELECT {_COLUMNS} FROM actors")):
            self._keep(rec)

    def close(self) -> None:
        self._quick.close()
        self._db.close()

    def _keep(self, rec: ActorRecord) -> None:
        key = (rec.atespace, rec.name)
        self._actors[key] = rec
        self._names.setdefault(rec.name, key)

    def _forget(self, rec: ActorRecord) -> None:
        key = (rec.atespace, rec.name)
        self._actors.pop(key, None)
        if self._names.get(rec.name) == key:
            del self._names[rec.name]

    # -- atespaces --------------------------------------------------------------------------------

    def atespace_exists(self, name: str) -> bool:
        return self._db.execute("SELECT 1 FROM atespaces WHERE name=?", (name,)).fetchone() is not None

    def add_atespace(self, name: str) -> bool:
        """False if it already existed."""
        cur = self._db.execute("INSERT OR IGNORE INTO atespaces(name) VALUES (?)", (name,))
        return cur.rowcount == 1

    def atespaces(self) -> list[str]:
        return [str(r[0]) for r in self._db.execute("SELECT name FROM atespaces ORDER BY name")]

    def remove_atespace(self, name: str) -> bool:
        return self._db.execute("DELETE FROM atespaces WHERE name=?", (name,)).rowcount == 1

    def count_actors(self, atespace: str) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM actors WHERE atespace=?", (atespace,)).fetchone()
        return int(row[0])

    # -- actors -----------------------------------------------------------------------------------

    def get(self, atespace: str, name: str) -> ActorRecord | None:
        return self._actors.get((atespace, name))

    def find_name(self, name: str) -> ActorRecord | None:
        """The actor of that name in any atespace (names are unique across atespaces)."""
        key = self._names.get(name)
        return self._actors[key] if key is not None else None

    def insert(self, record: ActorRecord) -> None:
        """Raises sqlite3.IntegrityError if the actor exists."""
        self._db.execute(f"INSERT INTO actors({_COLUMNS}) VALUES ({_PLACEHOLDERS})", _row(record))
        self._keep(record)

    def update(self, record: ActorRecord, durable: bool = True) -> ActorRecord:
        """Store `record` (made by `evolve`) if the stored version is the one before it; without
        `durable`, committed without waiting for the disk (see the module's doc)."""
        db = self._db if durable else self._quick
        cur = db.execute(_UPDATE, (*_row(record), record.atespace, record.name, record.version - 1))
        if cur.rowcount != 1:
            raise VersionConflict(f"{record.atespace}/{record.name}")
        self._keep(record)
        return record

    def delete(self, record: ActorRecord) -> bool:
        cur = self._db.execute(
            "DELETE FROM actors WHERE atespace=? AND name=? AND version=?",
            (record.atespace, record.name, record.version),
        )
        if cur.rowcount != 1:
            return False
        self._forget(record)
        return True

    def page(self, atespace: str, after: tuple[str, str], limit: int) -> list[ActorRecord]:
        """Up to `limit` actors ordered by (atespace, name), strictly after `after`."""
        where = "(atespace, name) > (?, ?)" + (" AND atespace = ?" if atespace else "")
        args: tuple[object, ...] = (*after, atespace) if atespace else after
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM actors WHERE {where} ORDER BY atespace, name LIMIT ?", (*args, limit)
        )
        return [_record(r) for r in rows]

    def all(self) -> list[ActorRecord]:
        return list(self._actors.values())

    def clear(self) -> None:
        self._db.execute("DELETE FROM actors")
        self._db.execute("DELETE FROM atespaces")
        self._actors.clear()
        self._names.clear()
