"""The fleet's own Redis client on the shared test Redis (tests/conftest.py); `redis_client`, redis-py's,
is what its answers are compared with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from common.redis.client import RedisClient


@pytest.fixture
async def fleet_redis(redis_url: str) -> AsyncIterator[RedisClient]:
    client = RedisClient.from_url(redis_url)
    yield client
    await client.aclose()
