"""Journal compaction: kept lines are copied as they are, results stay readable by offset (inline)
or by file, interleaved and running jobs survive, and a restart replays the same journal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guest import journal as jmod


def _result(i: int) -> dict[str, object]:
    # Every fourth result is too big for its end line and goes to results/.
    size = jmod.INLINE_RESULT_BYTES + 1 if i % 4 == 0 else 10
    return {"output": f"r{i}-" + "é" * size}


def test_compaction_keeps_lines_offsets_and_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jmod, "KEEP_JOBS", 4)
    monkeypatch.setattr(jmod, "COMPACT_AT", 8)
    j = jmod.Journal(str(tmp_path))
    # Given a job still running from before everything else, and jobs that end out of order
    j.record_start("long", "bash", "sleep 100")
    for i in range(0, 20, 2):
        j.record_start(f"j{i}", "bash", f"cmd {i}")
        j.record_start(f"j{i + 1}", "read_file", f"file {i + 1}")
        j.record_end(f"j{i + 1}", "finished", _result(i + 1))
        j.record_end(f"j{i}", "finished", _result(i))
    # Then only the running job and the newest finished ones remain, each result readable
    kept = list(j.entries)
    assert kept[0] == "long" and len(kept) <= jmod.COMPACT_AT and "j0" not in kept
    for job_id in kept[1:]:
        assert j.load_result(job_id) == _result(int(job_id[1:]))
    results = {p.name for p in (tmp_path / "results").iterdir()}
    assert results == {f"{k}.json" for k in kept[1:] if int(k[1:]) % 4 == 0}  # dropped ones removed
    # And the file holds exactly their lines: a start and (ended) an end each, nothing torn
    records = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_bytes().splitlines()]
    assert sorted(r["job"] for r in records if r["e"] == "start") == sorted(kept)
    assert sorted(r["job"] for r in records if r["e"] == "end") == sorted(kept[1:])
    j.close()
    # When the guest restarts, it replays the same jobs in the same order
    j2 = jmod.Journal(str(tmp_path))
    assert list(j2.entries) == kept
    assert j2.entries["long"].state == "interrupted" and j2.load_result("long")["interrupted"]
    for job_id in kept[1:]:
        assert j2.load_result(job_id) == _result(int(job_id[1:]))
    j2.close()


def test_records_are_compact_json_and_record_end_returns_the_result_json(tmp_path: Path) -> None:
    j = jmod.Journal(str(tmp_path))
    j.record_start("a", "bash", 'echo "ünï\\code"\n\t')
    result = {"output": 'ünïcode "quoted"\n', "n": 1.5, "none": None}
    recorded = j.record_end("a", "finished", result)
    assert recorded == json.dumps(result, separators=(",", ":")).encode()
    entry = j.entries["a"]
    start = {"e": "start", "job": "a", "tool": "bash", "summary": entry.summary, "ts": entry.started_at}
    end = {"e": "end", "job": "a", "state": "finished", "ts": entry.finished_at, "result": result}
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines()
    assert lines == [json.dumps(rec, separators=(",", ":")).encode() for rec in (start, end)]
    j.close()
