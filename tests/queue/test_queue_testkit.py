"""The session log checker the chaos and stress tests rely on (pure logic)."""

from __future__ import annotations

from queue_testkit import LogEntry, check_session_log


def log(*entries: str) -> list[LogEntry]:
    """`kind job epoch worker` per entry, timestamps in order."""
    out = []
    for ts, entry in enumerate(entries):
        kind, jid, epoch, worker = entry.split()
        out.append(LogEntry(kind, jid, int(epoch), worker, float(ts)))
    return out


def test_a_live_execution_overlapped_by_another_is_a_problem() -> None:
    entries = log("S a 1 w1", "S a 2 w2", "E a 2 w2", "E a 1 w1", "S b 2 w2", "E b 2 w2")
    assert any(p.startswith("overlap") for p in check_session_log(entries, ["a", "b"], killed=set()))


def test_an_execution_of_a_killed_worker_or_cancelled_at_its_lease_loss_may_resume_at_the_head() -> None:
    killed = log("S a 1 w1", "S a 2 w2", "E a 2 w2", "S b 2 w2", "E b 2 w2")
    assert check_session_log(killed, ["a", "b"], killed={"w1"}) == []
    # the cancelled execution may log its interruption only after the resumed one started
    cancelled = log("S a 1 w1", "S a 2 w2", "X a 1 w1", "E a 2 w2", "S b 2 w2", "E b 2 w2")
    assert check_session_log(cancelled, ["a", "b"], killed=set()) == []


def test_an_interrupted_execution_must_resume_at_the_head() -> None:
    entries = log("S a 1 w1", "X a 1 w1", "S b 2 w2", "E b 2 w2")
    assert check_session_log(entries, ["a", "b"], killed=set()) != []
