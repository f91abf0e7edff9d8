"""The local Substrate's sqlite store (local_substrate/store.py): a status change committed without
waiting for the disk (`durable=False`, a resume's or park's) is still seen by the next process
that opens the file after this one is SIGKILLed, and leaves every later commit durable; what the
store answers from memory is what the file holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from local_substrate.store import ActorRecord, Status, Store, VersionConflict

#: Opens the store, makes the actor RUNNING without waiting for the disk, says so, then waits to
#: be killed (nothing closes the connection or checkpoints the WAL).
CHILD = textwrap.dedent("""
    import sys, time
    from local_substrate.store import Status, Store
    store = Store(sys.argv[1])
    rec = store.find_name("a")
    store.update(rec.evolve(status=Status.RUNNING, slot="slot-0"), durable=False)
    print("updated", flush=True)
    time.sleep(60)
""")


def test_a_commit_without_waiting_for_the_disk_survives_the_process(tmp_path: Path) -> None:
    db = tmp_path / "actors.db"
    store = Store(db)
    store.add_atespace("x")
    store.insert(ActorRecord("x", "a", "ns", "t"))
    store.close()

    child = subprocess.Popen([sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE,
                             cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"updated\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()

    reopened = Store(db)
    rec = reopened.find_name("a")
    assert rec is not None and rec.status is Status.RUNNING and rec.slot == "slot-0"


def test_a_commit_without_waiting_leaves_the_next_ones_durable(tmp_path: Path) -> None:
    store = Store(tmp_path / "actors.db")
    store.add_atespace("x")
    rec = ActorRecord("x", "a", "ns", "t")
    store.insert(rec)
    store.update(rec.evolve(status=Status.RESUMING), durable=False)
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store._quick.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL, for those alone


def _on_file(db: Path) -> list[ActorRecord]:
    reopened = Store(db)
    try:
        return sorted(reopened.all(), key=lambda r: r.name)
    finally:
        reopened.close()


def test_what_the_store_answers_is_what_the_file_holds(tmp_path: Path) -> None:
    db = tmp_path / "actors.db"
    store = Store(db)
    store.add_atespace("x")
    a, b = ActorRecord("x", "a", "ns", "t"), ActorRecord("x", "b", "ns", "t", selector={"k": "v"})
    store.insert(a)
    store.insert(b)
    a = store.update(a.evolve(status=Status.RESUMING, slot="slot-0", run_id="r1"), durable=False)
    a = store.update(a.evolve(status=Status.SUSPENDED, slot="", snapshot="/s/1", dropped=("fifo",)))
    with pytest.raises(VersionConflict):  # a writer that read an older version
        store.update(b.evolve().evolve(held="slot-1"))
    assert store.get("x", "b") == b and store.find_name("b") == b
    assert sorted(store.all(), key=lambda r: r.name) == _on_file(db) == [a, b]

    assert not store.delete(a.evolve())  # not the stored version
    assert store.delete(a)
    assert store.get("x", "a") is None and store.find_name("a") is None
    assert store.all() == _on_file(db) == [b]
    store.clear()
    assert store.all() == _on_file(db) == [] and store.find_name("b") is None
