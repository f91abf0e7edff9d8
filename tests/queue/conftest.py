"""Fixtures for the queue tests: a Queue on the shared real Redis with short test timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from common.config import Config, parse_config
from common.queue import Consumer, Handler, Queue
from common.redis.client import RedisClient


@pytest.fixture
def queue_config() -> Config:
    return parse_config({
        "workers": {"lease_ttl_s": 1.0, "max_attempts": 3, "retry_backoff_base_s": 0.05,
                    "retry_backoff_max_s": 0.2, "jobs_per_turn": 4},
        "jobs": {"output_stream_maxlen": 50},
    })


@pytest.fixture
async def queue(redis_url: str, queue_config: Config) -> AsyncIterator[Queue]:
    async with RedisClient.from_url(redis_url) as client:
        yield Queue(client, queue_config)


@pytest.fixture
async def start_consumer(queue: Queue) -> AsyncIterator[Callable[..., Consumer]]:
    """Factory: start a Consumer on `queue` in this loop; all are stopped at teardown."""
    running: list[tuple[Consumer, asyncio.Task[None]]] = []

    def start(handler: Handler, worker_id: str = "w1", **kwargs: Any) -> Consumer:
        consumer = Consumer(queue, worker_id, handler, block_ms=100, stop_grace_s=2.0, **kwargs)
        running.append((consumer, asyncio.create_task(consumer.run())))
        return consumer

    yield start
    for consumer, task in running:
        await consumer.stop()
        await task
