"""A full Redis under load, through the real fleet: clients get 503 problem+json with
Retry-After, nothing acknowledged is lost, and the fleet recovers by itself once memory frees."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.exceptions import OutOfMemoryError
from test_e2e_async import ASYNC, bash, resume, wait_done

from tests.e2e.conftest import ClientThreads, base_config, free_port, start_fleet

MAXMEMORY_MB = 32
SESSIONS = 3


def fleet_redis(state_dir: Path) -> redis.Redis:
    d = state_dir / "redis"
    return redis.Redis(host="127.0.0.1", port=int((d / "port").read_text()),
                       password=(d / "password").read_text().strip())


class Load(ClientThreads):
    """One client thread per session posting async `echo` calls back to back."""

    def __init__(self, url: str, bases: list[str]) -> None:
        self.url, self.bases = url, bases
        self.answers: list[tuple[float, int, httpx.Headers, Any]] = []
        super().__init__(bases)

    def _run(self, base: str) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            n = 0
            while not self.stop.is_set():
                r = c.post(base, json=bash(f"echo {n}"), headers=ASYNC)
                self.answers.append((time.monotonic(), r.status_code, r.headers, r.json()))
                n += 1



@pytest.mark.embedded_redis  # the cap is the embedded server's (`redis.maxmemory_mb`)
def test_a_full_redis_answers_503_loses_nothing_acknowledged_and_recovers(short_tmp: Path) -> None:
    fleet = start_fleet(short_tmp, base_config(short_tmp, free_port(), redis={"maxmemory_mb": MAXMEMORY_MB}))
    r = fleet_redis(fleet.state_dir)
    try:
        # given the embedded Redis runs with the configured cap and refuses rather than evicts
        assert r.config_get("maxmemory")["maxmemory"] == str(MAXMEMORY_MB << 20)
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        with fleet.client() as c:
            bases = [resume(c, f"full-{i}") for i in range(SESSIONS)]
            with Load(fleet.url, bases) as load:
                time.sleep(1.0)
                # when Redis fills up under that load (ballast up to the cap, then held over it)
                fill_from, n = time.monotonic(), 0
                try:
                    while True:
                        r.set(f"t:ballast:{n}", "x" * 65536)
                        n += 1
                except OutOfMemoryError:
                    pass
                r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - (1 << 20))
                time.sleep(3.0)
                sync = c.post(bases[0], json=bash("echo sync"))
                # then memory frees (the ballast goes, the cap is back) and the load goes on
                r.delete(*(f"t:ballast:{i}" for i in range(n)))
                r.config_set("maxmemory", MAXMEMORY_MB << 20)
                freed_at = time.monotonic()
                time.sleep(3.0)
            # then while full, clients got 503 problem+json with Retry-After
            refused = [a for a in load.answers if a[1] == 503]
            assert refused, "no request was refused while Redis was full"
            for _, _, headers, body in refused + [(0, sync.status_code, sync.headers, sync.json())]:
                assert headers["content-type"].startswith("application/problem+json")
                assert int(headers["retry-after"]) >= 1 and body["type"].endswith("/unavailable")
            assert sync.status_code == 503
            assert not [a for a in load.answers if a[1] not in (202, 503)]
            assert all(a[0] >= fill_from for a in refused)
            # and the fleet recovered by itself: accepted again once memory freed
            assert [a for a in load.answers if a[1] == 202 and a[0] > freed_at]
            # and every acknowledged call ran
            accepted = [body["id"] for _, status, _, body in load.answers if status == 202]
            for job_id in accepted:
                assert wait_done(c, job_id)["state"] == "succeeded", job_id
    finally:
        r.close()
        fleet.stop()
