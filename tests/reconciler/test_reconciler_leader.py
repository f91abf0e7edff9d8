"""Leader election: one active reconciler, passive standbys, takeover within one lease TTL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from common.queue import JobKind
from tests.reconciler.conftest import ENV, Fleet, set_session, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


async def _leader(fleet: Fleet) -> str:
    raw = await fleet.queue.redis.get(fleet.queue.keys.reconciler_leader)
    return raw.decode() if raw else ""


async def _epoch(fleet: Fleet) -> int:
    return int(await fleet.queue.redis.get(fleet.queue.keys.reconciler_epoch) or 0)


def _start_process(fleet: Fleet) -> subprocess.Popen[bytes]:
    """A reconciler in its own process (`atefleet reconciler`), so the test can SIGKILL it."""
    path = Path(fleet.config.state_dir) / "config.yaml"
    path.write_text(yaml.safe_dump(fleet.config.model_dump(mode="json")))
    env = {**os.environ, "ATEFLEET_CONFIG": str(path), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "atefleet", "reconciler"], cwd=REPO_ROOT, env=env,
                            stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def test_standby_stays_passive_until_the_leader_dies_then_takes_over(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(environments=[{"name": ENV, "idle_timeout_s": 1}])
    ttl_s = fleet.config.reconciler.leader_ttl_s
    proc = _start_process(fleet)
    try:
        await wait_for(lambda: _has_leader(fleet), 20, "the first reconciler to lead")
        first = await _leader(fleet)
        fleet.start_reconciler("standby")
        # the standby stays passive for several TTLs: same leader, no new epoch
        started = time.monotonic()
        while time.monotonic() - started < 3 * ttl_s:
            assert await _leader(fleet) == first and await _epoch(fleet) == 1
            await asyncio.sleep(0.05)
        # when the leader dies without a word
        proc.kill()
        proc.wait()
        died = time.monotonic()
        await wait_for(lambda: _led_by(fleet, "standby"), 3 * ttl_s, "the standby to take over", every_s=0.01)
        takeover_s = time.monotonic() - died
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert takeover_s <= ttl_s + 0.1, f"takeover took {takeover_s:.3f} s (ttl {ttl_s} s)"
    assert await _epoch(fleet) == 2
    # and the new leader runs the passes: an idle session gets its suspend_if_idle job
    await set_session(fleet.queue, "idle", state="running", last_activity=str(time.time() - 5))
    await wait_for(lambda: _fifo_has_idle_job(fleet, "idle"), 5, "the new leader's idle pass")


async def test_a_leader_that_stops_hands_over_at_once(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet()
    leader = fleet.start_reconciler("one")
    await wait_for(lambda: _led_by(fleet, "one"), 5, "the first reconciler to lead")
    fleet.start_reconciler("two")
    await leader.halt()
    stopped = time.monotonic()
    await wait_for(lambda: _led_by(fleet, "two"), 5, "the standby to take over", every_s=0.01)
    # a released lease is taken at the standby's next try (at most TTL/3 later)
    assert time.monotonic() - stopped <= fleet.config.reconciler.leader_ttl_s / 3 + 0.1


async def _has_leader(fleet: Fleet) -> bool:
    return bool(await _leader(fleet))


async def _led_by(fleet: Fleet, instance: str) -> bool:
    return (await _leader(fleet)).startswith(f"{instance}:")


async def _fifo_has_idle_job(fleet: Fleet, sid: str) -> bool:
    ids = await fleet.queue.redis.lrange(fleet.queue.keys.fifo(f"{ENV}/{sid}"), 0, -1)
    jobs = [await fleet.queue.get_job(i.decode()) for i in ids]
    return any(j is not None and j.kind == JobKind.SUSPEND_IF_IDLE for j in jobs)
