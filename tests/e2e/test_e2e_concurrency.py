"""Ordering through the whole fleet: many concurrent sync calls per session, many sessions at once."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.e2e.conftest import RunningFleet


def _append(line: str) -> dict[str, object]:
    return {
        "call_id": line,
        "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {line} >> log.txt"})},
    }


def _read_log() -> dict[str, object]:
    return {
        "call_id": "read",
        "type": "function_call",
        "function": {"name": "read_file", "arguments": json.dumps({"path": "log.txt"})},
    }


def test_100_concurrent_sync_calls_on_one_session_all_run_one_at_a_time(fleet: RunningFleet) -> None:
    sid = str(uuid.uuid4())
    base = f"/v1/environments/my-env/sessions/{sid}"
    with fleet.client() as c:
        assert c.post(f"{base}/resume").status_code == 200

    def call(i: int) -> int:
        with fleet.client() as c:
            body = {
                "call_id": f"c{i}",
                "type": "function_call",
                "function": {
                    "name": "bash",
                    # one at a time: a lock file that must not exist when a call starts
                    "arguments": json.dumps(
                        {
                            "command": f"test ! -e busy && touch busy && echo {i} >> log.txt; "
                            f"r=$?; rm -f busy; exit $r"
                        }
                    ),
                },
            }
            r = c.post(base, json=body)
            assert r.status_code == 200, r.text
            return int(r.json()["exit_code"])

    with ThreadPoolExecutor(32) as pool:
        codes = list(pool.map(call, range(100)))
    assert codes == [0] * 100
    with fleet.client() as c:
        lines = c.post(base, json=_read_log()).json()["output"].split()
    assert sorted(map(int, lines)) == list(range(100))


def test_50_sessions_in_parallel_each_keep_their_order(fleet: RunningFleet) -> None:
    sessions = [f"par-{uuid.uuid4()}" for _ in range(50)]

    def run(sid: str) -> list[str]:
        base = f"/v1/environments/my-env/sessions/{sid}"
        with fleet.client() as c:
            assert c.post(f"{base}/resume").status_code == 200, sid
            for i in range(10):
                assert c.post(base, json=_append(f"l{i}")).status_code == 200
            out = c.post(base, json=_read_log()).json()["output"].split()
            assert c.post(f"{base}/suspend").status_code == 200
            return list(out)

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(run, sessions))
    for out in results:
        assert out == [f"l{i}" for i in range(10)]
