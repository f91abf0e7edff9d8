"""The embedded Redis stays bounded on disk and in memory: AOF rewrites at the configured
thresholds, a maxmemory with noeviction, and its log rotated by size."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from common.config import RedisConfig
from common.embedded_redis import DEFAULT_MEMORY_SHARE, EmbeddedRedis, rotate_log, start_embedded_redis


def wait_for_sync(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[tuple[EmbeddedRedis, redis.Redis]]:
    server = start_embedded_redis(tmp_path / "redis", settings=RedisConfig(
        maxmemory_mb=64, aof_rewrite_percentage=100, aof_rewrite_min_mb=1))
    client = redis.Redis.from_url(server.url)
    try:
        yield server, client
    finally:
        client.close()
        server.stop()


def test_the_aof_is_rewritten_as_it_grows(
    small_redis: tuple[EmbeddedRedis, redis.Redis]
) -> None:
    server, r = small_redis
    assert r.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"] == str(1 << 20)
    # given 8 MB written to 10 keys (live data: 10 KB) in batches, past the 1 MB minimum often
    for _ in range(8):
        for n in range(1000):
            r.set(f"k{n % 10}", os.urandom(512).hex())
        wait_for_sync(lambda: not r.info("persistence")["aof_rewrite_in_progress"], 30, "a rewrite to end")
    # then Redis rewrote the file as it grew, so it holds far less than was written
    log = (server.data_dir / "redis.log").read_text()
    assert log.count("Background AOF rewrite finished successfully") >= 2
    assert (server.data_dir / "appendonly.aof").stat().st_size < 4 << 20


def test_memory_is_capped_and_a_full_redis_refuses_rather_than_evicts(
    small_redis: tuple[EmbeddedRedis, redis.Redis], tmp_path: Path
) -> None:
    _, r = small_redis
    assert r.config_get("maxmemory")["maxmemory"] == str(64 << 20)
    assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    default = start_embedded_redis(tmp_path / "default")
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        got = int(redis.Redis.from_url(default.url).config_get("maxmemory")["maxmemory"])
        assert got == int(ram * DEFAULT_MEMORY_SHARE)
    finally:
        default.stop()


def test_the_log_is_rotated_past_its_size(tmp_path: Path) -> None:
    log = tmp_path / "redis.log"
    log.write_text("x" * 100)
    assert not rotate_log(tmp_path, 1000)
    log.write_text("x" * 2000)
    assert rotate_log(tmp_path, 1000)
    assert not log.exists() and (tmp_path / "redis.log.1").stat().st_size == 2000
    assert not rotate_log(tmp_path / "nowhere", 1000)
