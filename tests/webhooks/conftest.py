"""Fixtures of the webhook tests: a loopback receiver, the queue, deliverers stopped at teardown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from webhook_fixtures import DelivererFactory, Fleet, Receiver, make_config

from common.config import Config
from common.queue import Queue
from common.redis.client import RedisClient
from common.redis.settings import RedisSettings
from workers.webhooks import Deliverer


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    rec.port = server.sockets[0].getsockname()[1]
    yield rec
    server.close()
    await server.wait_closed()


@pytest.fixture
async def fleet(redis_client: aioredis.Redis, redis_url: str) -> AsyncIterator[Fleet]:
    config = make_config()
    async with RedisClient.from_url(redis_url) as client:
        yield Fleet(config, redis_client, Queue(client, config))


@pytest.fixture
async def start_deliverer(redis_url: str) -> AsyncIterator[DelivererFactory]:
    """Start deliverers (stopped at teardown if the test did not stop them)."""
    started: list[Deliverer] = []

    async def start(config: Config | None = None) -> Deliverer:
        settings = RedisSettings.from_url(redis_url)
        deliverer = Deliverer(config or make_config(), settings, consumer="test-deliverer")
        await deliverer.start()
        started.append(deliverer)
        return deliverer

    yield start
    for deliverer in started:
        await deliverer.stop()
