"""`Client`: the API from synchronous code (threads may share one), and its `Session`."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from atefleet.client import _api, _plans
from atefleet.client._core import ClientCore, SessionCore
from atefleet.client._plans import STREAM_IDLE_TIMEOUT_S, Feed, Plan, Step
from atefleet.client._sync_http import SyncTransport
from atefleet.client.errors import TRANSPORT_FAILURES
from atefleet.client.models import Environment, Job, OutputChunk, SessionInfo, ToolResult

T = TypeVar("T")


class Client(ClientCore[SyncTransport]):
    """The atefleet API. `Client()` reads `$ATEFLEET_API_URL` and `$ATEFLEET_TOKEN`."""

    transport_class = SyncTransport

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    # ---- the runner ------------------------------------------------------------------------
    def _run(self, plan: Plan[T]) -> T:
        """Carry `plan` out over this client's transport; its value."""
        answer: Any = None
        resume = plan.send
        while True:
            try:
                step = resume(answer)
            except StopIteration as end:
                value: T = end.value
                return value
            try:
                answer, resume = self._carry_out(step), plan.send
            except TRANSPORT_FAILURES as err:  # thrown into the plan, where the retry rules are
                answer, resume = err, plan.throw

    def _carry_out(self, step: Step) -> Any:
        # `type(...) is` rather than `match`: a call's Send goes first, at ~1.5 µs less per call.
        if type(step) is _plans.Send:
            return self._transport.send(step.request, step.timeout_s)
        if type(step) is _plans.Read:
            return next(step.body, None)
        if type(step) is _plans.Open:
            return self._transport.stream(step.request, STREAM_IDLE_TIMEOUT_S)
        if type(step) is _plans.Close:
            step.body.close()
        elif type(step) is _plans.Sleep:
            time.sleep(step.delay_s)
        return None

    def _iterate(self, feed: Feed[T]) -> Iterator[T]:
        while (items := self._run(feed.next())) is not None:
            yield from items

    # ---- discovery -------------------------------------------------------------------------
    def environments(self) -> list[Environment]:
        return self._run(self._plans.call(_api.environments_op()))

    def tools(self, env: str, format: str = "openai") -> list[dict[str, Any]]:
        """Tool definitions for a model API (`openai` or `anthropic`), as the environment allows them."""
        return self._run(self._plans.call(_api.tools_op(env, format)))

    def sessions(self, env: str, *, page_size: int = 1000) -> Iterator[SessionInfo]:
        return self._iterate(self._plans.pages(lambda cursor: _api.sessions_op(env, cursor, page_size)))

    def get(self, path: str, **params: Any) -> Any:
        """Any other GET route's JSON, as is."""
        return self._run(self._plans.call(_api.get_op(path, params)))

    def capacity(self) -> dict[str, Any]:
        """Substrate workers and sessions running / parked / waiting (`GET /v1/capacity`)."""
        return self._run(self._plans.call(_api.capacity_op()))

    def audit(self, *, page_size: int = 100, **filters: str) -> Iterator[dict[str, Any]]:
        """Audit records, oldest first (admin scope); filters: principal, session, since, until."""
        return self._iterate(self._plans.pages(lambda cursor: _api.audit_op(filters, cursor, page_size)))

    def dead_letters(self, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Dead-lettered jobs (`GET /v1/dlq`), newest first (admin scope)."""
        return self._iterate(self._plans.pages(lambda cursor: _api.dlq_page_op(cursor, page_size)))

    def dead_letter(self, entry_id: str) -> dict[str, Any]:
        return self._run(self._plans.call(_api.dead_letter_op(entry_id)))

    def replay(self, entry_id: str) -> Job:
        return self._run(self._plans.call(_api.replay_op(entry_id)))

    def discard(self, entry_id: str) -> None:
        """Drop a DLQ entry (its failed job stays until it expires)."""
        self._run(self._plans.call(_api.discard_op(entry_id)))

    # ---- sessions --------------------------------------------------------------------------
    def session(self, env: str, sid: str, *, auto_resume: bool = False,
                env_variables: Mapping[str, str] | None = None) -> Session:
        return Session(self, env, sid, auto_resume=auto_resume, env_variables=env_variables)

    def run(self, env: str, sid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """One sync tool call (any accepted body); a call outlasting the API's sync wait is followed."""
        return self._run(self._plans.followed(_api.call_op(env, sid, body)))

    # ---- jobs ------------------------------------------------------------------------------
    def submit(self, env: str, sid: str, body: Mapping[str, Any]) -> Job:
        """Enqueue a tool call (any accepted body) and answer at once with its job."""
        return self._run(self._plans.call(_api.submit_op(env, sid, body)))

    def job(self, job_id: str) -> Job:
        return self._run(self._plans.call(_api.job_op(job_id)))

    def wait(self, job: Job | str, timeout_s: float | None = None) -> Job:
        """Long-poll until the job ends; JobNotFinished after `timeout_s` (None: no limit)."""
        return self._run(self._plans.wait(job, timeout_s))

    def result(self, job: Job | str, timeout_s: float | None = None) -> dict[str, Any]:
        """The job's result once it ends; its problem raised if it failed or was cancelled."""
        return self._run(self._plans.result(job, timeout_s))

    def cancel(self, job: Job | str) -> Job:
        return self._run(self._plans.cancel(job))

    def batch(self, calls: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Submit many calls at once (each with `environment` and `session`); per-session order kept."""
        return self._run(self._plans.call(_api.batch_op(calls)))

    def as_completed(self, jobs: Iterable[Job | str], *, parallel: int = 8) -> Iterator[Job]:
        """Each job once it ends, in the order they end: up to `parallel` multi-job waits in flight
        (a thread each), each over a run of the jobs expected to end together, the runs followed in
        the order they are expected to end (`_plans.Plans.completions`). A wait that fails raises
        here; leaving early stops the waits after their current request."""
        feeds = self._plans.completions(jobs)
        ended: queue.SimpleQueue[list[Job] | Exception | None] = queue.SimpleQueue()  # None: a feed's end
        stop = threading.Event()

        def follow(feed: Feed[Job]) -> None:
            try:
                while not stop.is_set() and (items := self._run(feed.next())) is not None:
                    ended.put(items)
            except Exception as err:  # the caller's to see, not this thread's
                ended.put(err)
            ended.put(None)

        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(parallel, len(feeds))))
        try:
            for feed in feeds:
                pool.submit(follow, feed)
            running = len(feeds)
            while running:
                items = ended.get()
                if isinstance(items, Exception):
                    raise items
                if items is None:
                    running -= 1
                    continue
                yield from items
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def stream(self, job: Job | str) -> Iterator[OutputChunk | Job]:
        """The job's output chunks as they come, then the finished job. A dropped stream is
        reopened from the last event seen (Last-Event-ID), so no chunk is lost or repeated."""
        return self._iterate(self._plans.events(job))


class Session(SessionCore[ToolResult]):
    """One session of an environment: its lifecycle, and one method per tool."""

    def __init__(self, client: Client, env: str, sid: str, *, auto_resume: bool = False,
                 env_variables: Mapping[str, str] | None = None) -> None:
        super().__init__(client._plans, env, sid, auto_resume=auto_resume, env_variables=env_variables)
        self.client = client

    def resume(self) -> dict[str, Any]:
        """Create (if needed) and resume the actor; `cold_start` says whether a snapshot was baked."""
        return self.client._run(self._plan_lifecycle("resume"))

    def suspend(self, *, force: bool = False) -> dict[str, Any]:
        return self.client._run(self._plan_lifecycle("suspend", force=force))

    def destroy(self, *, keep_snapshot: bool = False) -> dict[str, Any]:
        return self.client._run(self._plan_lifecycle("destroy", keep_snapshot=keep_snapshot))

    def view(self) -> SessionInfo:
        return self.client._run(self._plan_view())

    def tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return self.client._run(self._plan_tool(name, arguments))

    def call(self, item: Any) -> dict[str, Any]:
        """Run a model's tool call (OpenAI Responses / Chat Completions / Anthropic / seed item) and
        answer the result item that model API expects next (see `atefleet.client.tool_shapes`)."""
        return self.client._run(self._plan_call(item))

    def submit(self, name: str, arguments: dict[str, Any], *, callback_url: str | None = None,
               callback_secret_id: str | None = None) -> Job:
        """Enqueue a tool call and answer with its job at once; `callback_url` gets a signed
        webhook when it ends (`callback_secret_id` names the fleet's signing secret)."""
        return self.client._run(self._plan_submit(name, arguments, callback_url, callback_secret_id))

    def exec(self, command: str, **arguments: Any) -> Iterator[OutputChunk | Job]:
        """Run a shell command as a job and stream its output, then the finished job."""
        return self.client.stream(self.submit("bash", {"command": command, **arguments}))
