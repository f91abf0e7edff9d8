"""`AsyncClient`: the API from asyncio code, and its `AsyncSession`; `as_completed` for fan-out."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from typing import Any, TypeVar

from atefleet.client import _api
from atefleet.client._aio_http import AsyncTransport
from atefleet.client._tools import ToolMethods
from atefleet.client._wire import Response
from atefleet.client.client import STREAM_IDLE_TIMEOUT_S, settings_from_env
from atefleet.client.errors import TRANSPORT_FAILURES, JobNotFinished, transport_error
from atefleet.client.models import Environment, Job, OutputChunk, SessionInfo, ToolResult
from atefleet.client.sse import EventParser
from atefleet.client.tool_shapes import as_item, request_body, result_item, shape_of

T = TypeVar("T")


class AsyncClient:
    """The atefleet API for asyncio. `AsyncClient()` reads `$ATEFLEET_API_URL` and `$ATEFLEET_TOKEN`."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *,
                 tls: ssl.SSLContext | None = None, **options: Any) -> None:
        self.settings = settings_from_env(base_url, token, **options)
        self._transport = AsyncTransport(self.settings.base_url, self.settings.headers(), tls,
                                         self.settings.connect_timeout_s)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()

    # ---- sending ---------------------------------------------------------------------------
    async def _send(self, op: _api.Op[Any], timeout_s: float | None = None) -> Response:
        """The answer to `op`, retried (same Idempotency-Key) on 429/503 and lost connections."""
        request, attempt = op.request, 0
        while True:
            attempt += 1
            try:
                response = await self._transport.send(request, timeout_s or self.settings.timeout_s)
            except TRANSPORT_FAILURES as err:
                delay = _api.retry_delay_s(self.settings, attempt, None) \
                    if op.retryable_on_lost_connection else None
                if delay is None:
                    raise transport_error(err) from err
            else:
                delay = _api.retry_delay_s(self.settings, attempt, response)
                if delay is None:
                    return response
            await asyncio.sleep(delay)

    async def _do(self, op: _api.Op[T], timeout_s: float | None = None) -> T:
        return _api.decode(op, await self._send(op, timeout_s))

    # ---- discovery -------------------------------------------------------------------------
    async def environments(self) -> list[Environment]:
        return await self._do(_api.environments_op())

    async def tools(self, env: str, format: str = "openai") -> list[dict[str, Any]]:
        return await self._do(_api.tools_op(env, format))

    async def sessions(self, env: str, *, page_size: int = 1000) -> AsyncIterator[SessionInfo]:
        cursor = "0"
        while True:
            page, cursor = await self._do(_api.sessions_op(env, cursor, page_size))
            for info in page:
                yield info
            if cursor == "0":
                return

    async def get(self, path: str, **params: Any) -> Any:
        return await self._do(_api.get_op(path, params))

    async def capacity(self) -> dict[str, Any]:
        return dict(await self.get("/v1/capacity"))

    async def audit(self, *, page_size: int = 100, **filters: str) -> AsyncIterator[dict[str, Any]]:
        cursor = ""
        while True:
            page = await self._do(_api.audit_op(filters, cursor, page_size))
            for record in page["records"]:
                yield record
            cursor = page.get("next_cursor") or ""
            if not cursor or not page["records"]:
                return

    async def dead_letters(self, *, page_size: int = 100) -> AsyncIterator[dict[str, Any]]:
        cursor = ""
        while True:
            page = await self._do(_api.dlq_page_op(cursor, page_size))
            for entry in page["entries"]:
                yield entry
            cursor = page.get("next_cursor") or ""
            if not cursor:
                return

    async def dead_letter(self, entry_id: str) -> dict[str, Any]:
        return dict(await self._do(_api.dlq_entry_op("GET", entry_id)))

    async def replay(self, entry_id: str) -> Job:
        return Job.model_validate(await self._do(_api.dlq_entry_op("POST", entry_id, "replay")))

    async def discard(self, entry_id: str) -> None:
        await self._do(_api.dlq_entry_op("DELETE", entry_id))

    # ---- sessions --------------------------------------------------------------------------
    def session(self, env: str, sid: str, *, auto_resume: bool = False,
                env_variables: Mapping[str, str] | None = None) -> AsyncSession:
        return AsyncSession(self, env, sid, auto_resume=auto_resume, env_variables=env_variables)

    async def run(self, env: str, sid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        op = _api.call_op(env, sid, body)
        response = await self._send(op)
        if response.status == 202:
            return _api.job_outcome(await self.wait(_api.decode(op, response)["id"]))
        return _api.decode(op, response)

    # ---- jobs ------------------------------------------------------------------------------
    async def submit(self, env: str, sid: str, body: Mapping[str, Any]) -> Job:
        return await self._do(_api.submit_op(env, sid, body))

    async def job(self, job_id: str) -> Job:
        return await self._do(_api.job_op(job_id))

    async def wait(self, job: Job | str, timeout_s: float | None = None) -> Job:
        """Long-poll until the job ends; JobNotFinished after `timeout_s` (None: no limit)."""
        job_id = job if isinstance(job, str) else job.id
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = _api.LONG_POLL_S if deadline is None else \
                min(_api.LONG_POLL_S, deadline - time.monotonic())
            current = await self._do(_api.job_op(job_id, max(left, 0.001)), timeout_s=left + 30)
            if current.done:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise JobNotFinished(current)

    async def result(self, job: Job | str, timeout_s: float | None = None) -> dict[str, Any]:
        return _api.job_outcome(await self.wait(job, timeout_s))

    async def cancel(self, job: Job | str) -> Job:
        return await self._do(_api.cancel_op(job if isinstance(job, str) else job.id))

    async def batch(self, calls: Iterable[Mapping[str, Any]]) -> list[Job]:
        return await self._do(_api.batch_op(calls))

    async def as_completed(self, jobs: Iterable[Job | str], *, parallel: int = 64) -> AsyncIterator[Job]:
        """Each job once it ends, in the order they end (`parallel` long-polls at a time)."""
        gate = asyncio.Semaphore(parallel)

        async def finished(job: Job | str) -> Job:
            async with gate:
                return await self.wait(job)

        tasks = [asyncio.ensure_future(finished(job)) for job in jobs]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stream(self, job: Job | str) -> AsyncIterator[OutputChunk | Job]:
        """The job's output chunks as they come, then the finished job; a dropped stream is
        reopened from the last event seen (Last-Event-ID)."""
        job_id, last_id, attempt = (job if isinstance(job, str) else job.id), None, 0
        while True:
            try:
                head, body = await self._transport.stream(
                    _api.events_request(job_id, last_id), self.settings.connect_timeout_s)
                if head.status >= 400:
                    _api.raise_problem(Response(head.status, head.headers, b"".join([c async for c in body])))
                parser = EventParser()
                async for chunk in _idle_limited(body, STREAM_IDLE_TIMEOUT_S):
                    for event in parser.feed(chunk):
                        attempt, last_id = 0, event.id or last_id
                        if event.event == "result":
                            await body.aclose()
                            yield Job.model_validate(event.json())
                            return
                        if event.event == "output":
                            yield OutputChunk.model_validate(event.json())
                # Ended without the result (the API restarted): reopened where it stopped.
                raise ConnectionResetError("the event stream ended before the job's result")
            except TRANSPORT_FAILURES as err:
                attempt += 1
                delay = _api.retry_delay_s(self.settings, attempt, None)
                if delay is None:
                    raise transport_error(err) from err
                await asyncio.sleep(delay)


async def _idle_limited(chunks: AsyncIterator[bytes], idle_s: float) -> AsyncIterator[bytes]:
    """`chunks`, failing with TimeoutError when none arrives for `idle_s`."""
    iterator = aiter(chunks)
    while True:
        try:
            async with asyncio.timeout(idle_s):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        yield chunk


class AsyncSession(ToolMethods[Awaitable[ToolResult]]):
    """One session of an environment: its lifecycle, and one coroutine method per tool."""

    def __init__(self, client: AsyncClient, env: str, sid: str, *, auto_resume: bool = False,
                 env_variables: Mapping[str, str] | None = None) -> None:
        self.client, self.env, self.sid = client, env, sid
        self.auto_resume = auto_resume
        self.env_variables = dict(env_variables or {})

    async def resume(self) -> dict[str, Any]:
        return await self._lifecycle("resume")

    async def suspend(self, *, force: bool = False) -> dict[str, Any]:
        return await self._lifecycle("suspend", {"force": force} if force else None)

    async def destroy(self, *, keep_snapshot: bool = False) -> dict[str, Any]:
        return await self._lifecycle("destroy", {"keep_snapshot": keep_snapshot} if keep_snapshot else None)

    async def _lifecycle(self, action: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        op = _api.lifecycle_op(self.env, self.sid, action, wait=True, params=params)
        response = await self.client._send(op)
        if response.status == 202:
            return _api.job_outcome(await self.client.wait(_api.decode(op, response)["id"]))
        return _api.decode(op, response)

    async def view(self) -> SessionInfo:
        return await self.client._do(_api.view_op(self.env, self.sid))

    def body(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return _api.envelope(item, auto_resume=self.auto_resume, env_variables=self.env_variables)

    async def tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return _api.tool_result(await self.client.run(self.env, self.sid,
                                                      self.body(_api.tool_item(name, arguments))))

    async def call(self, item: Any) -> dict[str, Any]:
        """Run a model's tool call and answer the result item that model API expects next."""
        raw = as_item(item)
        shape = shape_of(raw)
        answer = await self.client.run(self.env, self.sid, self.body(request_body(raw, shape)))
        return result_item(answer, raw, shape)

    async def submit(self, name: str, arguments: dict[str, Any], *, callback_url: str | None = None,
                     callback_secret_id: str | None = None) -> Job:
        body = _api.envelope(_api.tool_item(name, arguments), auto_resume=self.auto_resume,
                             env_variables=self.env_variables, callback_url=callback_url,
                             callback_secret_id=callback_secret_id)
        return await self.client.submit(self.env, self.sid, body)

    async def exec(self, command: str, **arguments: Any) -> AsyncIterator[OutputChunk | Job]:
        async for event in self.client.stream(await self.submit("bash", {"command": command, **arguments})):
            yield event
