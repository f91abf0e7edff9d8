"""Helpers of the webhook tests: a loopback receiver, jobs driven to completion, waiting on conditions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from arq.constants import result_key_prefix

from common.config import Config, parse_config
from common.queue import JobKind, JobRecord, JobState, NewJob, Queue
from workers.webhooks import Deliverer, arq_job_id

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

#: Upper bound of any wait in these tests (s); conditions normally hold within milliseconds.
WAIT_S = 15.0


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    """Wait until `check()` holds (polled), failing the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A loopback HTTP/1.1 server answering each POST with the next scripted status line.

    An answer is "STATUS LINE" or "STATUS LINE\nheader: value"; "hang" never answers.
    """

    answers: list[str] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            lines = head.split("\r\n")[1:]
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Received(headers, body, time.time()))
            answer = self.answers.pop(0) if self.answers else "204 No Content"
            if answer == "hang":
                await reader.read()  # never answer; wait until the client gives up and hangs up
                return
            status, _, extra = answer.partition("\n")
            extra_lines = f"{extra}\r\n" if extra else ""
            # One request per connection, said so: the client must not reuse it.
            head_out = f"HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n{extra_lines}\r\n"
            writer.write(head_out.encode())
            await writer.drain()
        finally:
            writer.close()

    async def got(self, count: int) -> None:
        async def check() -> bool:
            return len(self.requests) >= count

        await eventually(check)


def make_config(**webhooks: Any) -> Config:
    settings: dict[str, Any] = {
        "secrets": {"main": SECRET},
        "retry_schedule_s": [0, 0.2, 0.2],
        "allow_private_targets": True,
        "timeout_s": 5,
    }
    settings.update(webhooks)
    return parse_config({"redis_prefix": "wh:", "webhooks": settings})


@dataclass
class Fleet:
    """The queue plus helpers to finish jobs the way a worker does."""

    config: Config
    redis: aioredis.Redis
    queue: Queue

    async def submit(self, callback_url: str, secret_id: str | None = "main", session: str = "s1") -> str:
        job = NewJob("default-env", session, JobKind.TOOL, {"tool": "bash"}, "tester",
                     callback_url=callback_url, callback_secret_id=secret_id)
        return (await self.queue.enqueue(job)).job_id

    async def finish(self, job_id: str, result: dict[str, Any] | None = None) -> None:
        """Take the job through the worker path (take_work → complete) to `succeeded`."""
        for acquired in await self.queue.take_work("test-worker", 10):
            assert acquired.job.id == job_id
            await self.queue.complete(acquired.lease, job_id, JobState.SUCCEEDED,
                                      result=result or {"exit_code": 0, "stdout": "hi\n"})

    async def job(self, job_id: str) -> JobRecord:
        record = await self.queue.get_job(job_id)
        assert record is not None
        return record

    async def attempts(self, job_id: str, count: int) -> list[dict[str, Any]]:
        """Wait until `count` delivery attempts are recorded on the job; return them."""
        async def check() -> bool:
            return len((await self.job(job_id)).webhook_attempts) >= count

        await eventually(check)
        return (await self.job(job_id)).webhook_attempts

    async def delivery_done(self, job_id: str) -> None:
        """Wait until arq has finished the delivery job for good (its result is stored)."""
        async def check() -> bool:
            return bool(await self.redis.exists(result_key_prefix + arq_job_id(job_id)))

        await eventually(check)


DelivererFactory = Callable[..., Awaitable[Deliverer]]
