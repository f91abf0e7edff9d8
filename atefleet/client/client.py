"""`Client`: the API from synchronous code (threads may share one), and its `Session`."""

from __future__ import annotations

import concurrent.futures
import os
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from atefleet.client import _api
from atefleet.client._sync_http import SyncTransport
from atefleet.client._tools import ToolMethods
from atefleet.client._wire import Response
from atefleet.client.errors import TRANSPORT_FAILURES, JobNotFinished, transport_error
from atefleet.client.models import Environment, Job, OutputChunk, SessionInfo, ToolResult
from atefleet.client.sse import EventParser
from atefleet.client.tool_shapes import as_item, request_body, result_item, shape_of

T = TypeVar("T")

#: Read timeout of an event stream between two events (the API sends a keep-alive every 15 s).
STREAM_IDLE_TIMEOUT_S = 60.0


def settings_from_env(base_url: str | None, token: str | None, **options: Any) -> _api.Settings:
    """Settings from arguments, else `$ATEFLEET_API_URL` / `$ATEFLEET_TOKEN`, else the defaults."""
    url = base_url or os.environ.get("ATEFLEET_API_URL") or _api.Settings.base_url
    return _api.Settings(base_url=url.rstrip("/"), token=token or os.environ.get("ATEFLEET_TOKEN"), **options)


class Client:
    """The atefleet API. `Client()` reads `$ATEFLEET_API_URL` and `$ATEFLEET_TOKEN`."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *,
                 tls: ssl.SSLContext | None = None, **options: Any) -> None:
        self.settings = settings_from_env(base_url, token, **options)
        self._transport = SyncTransport(self.settings.base_url, self.settings.headers(), tls,
                                        self.settings.connect_timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    # ---- sending ---------------------------------------------------------------------------
    def _send(self, op: _api.Op[Any], timeout_s: float | None = None) -> Response:
        """The answer to `op`, retried (same Idempotency-Key) on 429/503 and lost connections."""
        request, attempt = op.request, 0
        while True:
            attempt += 1
            try:
                response = self._transport.send(request, timeout_s or self.settings.timeout_s)
            except TRANSPORT_FAILURES as err:
                delay = _api.retry_delay_s(self.settings, attempt, None) \
                    if op.retryable_on_lost_connection else None
                if delay is None:
                    raise transport_error(err) from err
            else:
                delay = _api.retry_delay_s(self.settings, attempt, response)
                if delay is None:
                    return response
            time.sleep(delay)

    def _do(self, op: _api.Op[T], timeout_s: float | None = None) -> T:
        return _api.decode(op, self._send(op, timeout_s))

    # ---- discovery -------------------------------------------------------------------------
    def environments(self) -> list[Environment]:
        return self._do(_api.environments_op())

    def tools(self, env: str, format: str = "openai") -> list[dict[str, Any]]:
        """Tool definitions for a model API (`openai` or `anthropic`), as the environment allows them."""
        return self._do(_api.tools_op(env, format))

    def sessions(self, env: str, *, page_size: int = 1000) -> Iterator[SessionInfo]:
        cursor = "0"
        while True:
            page, cursor = self._do(_api.sessions_op(env, cursor, page_size))
            yield from page
            if cursor == "0":
                return

    def get(self, path: str, **params: Any) -> Any:
        """Any other GET route's JSON, as is."""
        return self._do(_api.get_op(path, params))

    def capacity(self) -> dict[str, Any]:
        """Substrate workers and sessions running / parked / waiting (`GET /v1/capacity`)."""
        return dict(self.get("/v1/capacity"))

    def audit(self, *, page_size: int = 100, **filters: str) -> Iterator[dict[str, Any]]:
        """Audit records, oldest first (admin scope); filters: principal, session, since, until."""
        cursor = ""
        while True:
            page = self._do(_api.audit_op(filters, cursor, page_size))
            yield from page["records"]
            cursor = page.get("next_cursor") or ""
            if not cursor or not page["records"]:
                return

    def dead_letters(self, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Dead-lettered jobs (`GET /v1/dlq`), newest first (admin scope)."""
        cursor = ""
        while True:
            page = self._do(_api.dlq_page_op(cursor, page_size))
            yield from page["entries"]
            cursor = page.get("next_cursor") or ""
            if not cursor:
                return

    def dead_letter(self, entry_id: str) -> dict[str, Any]:
        """One DLQ entry and its job."""
        return dict(self._do(_api.dlq_entry_op("GET", entry_id)))

    def replay(self, entry_id: str) -> Job:
        """Re-enqueue a dead letter's job (same id) at its session's tail; the job, queued again."""
        return Job.model_validate(self._do(_api.dlq_entry_op("POST", entry_id, "replay")))

    def discard(self, entry_id: str) -> None:
        """Drop a DLQ entry (its failed job stays until it expires)."""
        self._do(_api.dlq_entry_op("DELETE", entry_id))

    # ---- sessions --------------------------------------------------------------------------
    def session(self, env: str, sid: str, *, auto_resume: bool = False,
                env_variables: Mapping[str, str] | None = None) -> Session:
        return Session(self, env, sid, auto_resume=auto_resume, env_variables=env_variables)

    def run(self, env: str, sid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One sync tool call (any accepted body); a call outlasting the API's sync wait is followed."""
        op = _api.call_op(env, sid, body)
        response = self._send(op)
        if response.status == 202:
            return _api.job_outcome(self.wait(_api.decode(op, response)["id"]))
        return _api.decode(op, response)

    # ---- jobs ------------------------------------------------------------------------------
    def submit(self, env: str, sid: str, body: Mapping[str, Any]) -> Job:
        """Enqueue a tool call (any accepted body) and answer at once with its job."""
        return self._do(_api.submit_op(env, sid, body))

    def job(self, job_id: str) -> Job:
        return self._do(_api.job_op(job_id))

    def wait(self, job: Job | str, timeout_s: float | None = None) -> Job:
        """Long-poll until the job ends; JobNotFinished after `timeout_s` (None: no limit)."""
        job_id = job if isinstance(job, str) else job.id
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = _api.LONG_POLL_S if deadline is None else \
                min(_api.LONG_POLL_S, deadline - time.monotonic())
            current = self._do(_api.job_op(job_id, max(left, 0.001)), timeout_s=left + 30)
            if current.done:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise JobNotFinished(current)

    def result(self, job: Job | str, timeout_s: float | None = None) -> dict[str, Any]:
        """The job's result once it ends; its problem raised if it failed or was cancelled."""
        return _api.job_outcome(self.wait(job, timeout_s))

    def cancel(self, job: Job | str) -> Job:
        return self._do(_api.cancel_op(job if isinstance(job, str) else job.id))

    def batch(self, calls: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Submit many calls at once (each with `environment` and `session`); per-session order kept."""
        return self._do(_api.batch_op(calls))

    def as_completed(self, jobs: Iterable[Job | str], *, parallel: int = 32) -> Iterator[Job]:
        """Each job once it ends, in the order they end (`parallel` long-polls at a time)."""
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            futures = [pool.submit(self.wait, job) for job in jobs]
            for future in concurrent.futures.as_completed(futures):
                yield future.result()

    def stream(self, job: Job | str) -> Iterator[OutputChunk | Job]:
        """The job's output chunks as they come, then the finished job. A dropped stream is
        reopened from the last event seen (Last-Event-ID), so no chunk is lost or repeated."""
        job_id, last_id, attempt = (job if isinstance(job, str) else job.id), None, 0
        while True:
            try:
                head, body = self._transport.stream(
                    _api.events_request(job_id, last_id), STREAM_IDLE_TIMEOUT_S)
                if head.status >= 400:
                    _api.raise_problem(Response(head.status, head.headers, b"".join(body)))
                parser = EventParser()
                for chunk in body:
                    for event in parser.feed(chunk):
                        attempt, last_id = 0, event.id or last_id
                        if event.event == "result":
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
                time.sleep(delay)


class Session(ToolMethods[ToolResult]):
    """One session of an environment: its lifecycle, and one method per tool."""

    def __init__(self, client: Client, env: str, sid: str, *, auto_resume: bool = False,
                 env_variables: Mapping[str, str] | None = None) -> None:
        self.client, self.env, self.sid = client, env, sid
        self.auto_resume = auto_resume
        self.env_variables = dict(env_variables or {})

    def resume(self) -> dict[str, Any]:
        """Create (if needed) and resume the actor; `cold_start` says whether a snapshot was baked."""
        return self._lifecycle("resume")

    def suspend(self, *, force: bool = False) -> dict[str, Any]:
        return self._lifecycle("suspend", {"force": force} if force else None)

    def destroy(self, *, keep_snapshot: bool = False) -> dict[str, Any]:
        return self._lifecycle("destroy", {"keep_snapshot": keep_snapshot} if keep_snapshot else None)

    def _lifecycle(self, action: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        op = _api.lifecycle_op(self.env, self.sid, action, wait=True, params=params)
        response = self.client._send(op)
        if response.status == 202:
            return _api.job_outcome(self.client.wait(_api.decode(op, response)["id"]))
        return _api.decode(op, response)

    def view(self) -> SessionInfo:
        return self.client._do(_api.view_op(self.env, self.sid))

    def body(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return _api.envelope(item, auto_resume=self.auto_resume, env_variables=self.env_variables)

    def tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        answer = self.client.run(self.env, self.sid, self.body(_api.tool_item(name, arguments)))
        return _api.tool_result(answer)

    def call(self, item: Any) -> dict[str, Any]:
        """Run a model's tool call (OpenAI Responses / Chat Completions / Anthropic / seed item) and
        answer the result item that model API expects next (see `atefleet.client.tool_shapes`)."""
        raw = as_item(item)
        shape = shape_of(raw)
        answer = self.client.run(self.env, self.sid, self.body(request_body(raw, shape)))
        return result_item(answer, raw, shape)

    def submit(self, name: str, arguments: dict[str, Any], *, callback_url: str | None = None,
               callback_secret_id: str | None = None) -> Job:
        """Enqueue a tool call and answer with its job at once; `callback_url` gets a signed
        webhook when it ends (`callback_secret_id` names the fleet's signing secret)."""
        body = _api.envelope(_api.tool_item(name, arguments), auto_resume=self.auto_resume,
                             env_variables=self.env_variables, callback_url=callback_url,
                             callback_secret_id=callback_secret_id)
        return self.client.submit(self.env, self.sid, body)

    def exec(self, command: str, **arguments: Any) -> Iterator[OutputChunk | Job]:
        """Run a shell command as a job and stream its output, then the finished job."""
        return self.client.stream(self.submit("bash", {"command": command, **arguments}))

