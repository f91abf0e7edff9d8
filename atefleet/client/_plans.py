"""Every client method's logic, written once as a plan: a generator that yields I/O steps and
returns the method's value. `Client` and `AsyncClient` each carry plans out with a small runner
over their own transport, so the two behave the same by construction: retries, following a call
that outlasted the API's sync wait, long-polling, paging and event-stream resumption live here;
each endpoint's request and answer model lives in `_api`.

A transport failure (OSError, TimeoutError, ProtocolError) while a step is carried out is thrown
into the plan at that step's `yield`, where the retry rules decide. Iterator methods are `Feed`s:
each `next()` plan answers the next items (maybe none), None at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from atefleet.client._api import (
    LONG_POLL_S,
    Op,
    Page,
    Settings,
    cancel_op,
    decode,
    events_request,
    job_op,
    job_outcome,
    raise_problem,
    retry_delay_s,
    wait_jobs_op,
)
from atefleet.client._wire import Request, Response
from atefleet.client.errors import TRANSPORT_FAILURES, JobNotFinished, transport_error
from atefleet.client.models import Job, OutputChunk
from atefleet.client.sse import EventParser

T = TypeVar("T")

#: Longest wait for an event stream's next chunk (the API sends a keep-alive every 15 s).
STREAM_IDLE_TIMEOUT_S = 60.0

#: Job ids `as_completed` lists in one POST /v1/jobs:wait (the API takes up to 1,000): a run of
#: jobs expected to end together; few, because the API reads every listed job per wait.
WAIT_CHUNK_IDS = 25


@dataclass(slots=True)
class Send:
    """Send `request` and read the whole answer: answered with the `Response`."""

    request: Request
    timeout_s: float


@dataclass(slots=True)
class Open:
    """Send `request` and read the answer's head: answered with (head `Response`, body), the body
    read by `Read` steps. An event stream's start."""

    request: Request


@dataclass(slots=True)
class Read:
    """Answered with the body's next chunk (None at its end), within STREAM_IDLE_TIMEOUT_S."""

    body: Any


@dataclass(slots=True)
class Close:
    """Let go of a body before its end (its connection is closed, not reused)."""

    body: Any


@dataclass(slots=True)
class Sleep:
    delay_s: float


Step = Send | Open | Read | Close | Sleep
Plan = Generator[Step, Any, T]


class Feed(Protocol[T]):
    def next(self) -> Plan[list[T] | None]: ...


def job_id_of(job: Job | str) -> str:
    return job if isinstance(job, str) else job.id


def expected_order(jobs: Iterable[Job | str]) -> list[Job | str]:
    """`jobs` in the order they are expected to end, for `as_completed` to long-poll them in: a
    session runs its jobs one after another, so the k-th job of every session comes before the
    (k+1)-th of any (ties, and ids whose session is unknown, keep their given order). Polled in
    the given order instead, 1,000 jobs of 100 sessions submitted session by session would hold
    every long-poll on the first few sessions' later jobs while the others' ended unseen."""
    seen: dict[tuple[str, str], int] = {}
    ranked = []
    for index, job in enumerate(jobs):
        session = (job.environment, job.session) if isinstance(job, Job) and job.session else ("", str(index))
        rank = seen[session] = seen.get(session, -1) + 1
        ranked.append((rank, index, job))
    return [job for _, _, job in sorted(ranked, key=lambda r: (r[0], r[1]))]


class Plans:
    """The plans behind the clients' methods, over one client's settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def answer(self, op: Op[Any], timeout_s: float | None = None) -> Plan[Response]:
        """The answer to `op`, retried (same Idempotency-Key) on 429/503 and lost connections."""
        send, attempt = Send(op.request, timeout_s or self.settings.timeout_s), 0
        while True:
            attempt += 1
            try:
                response: Response = yield send
            except TRANSPORT_FAILURES as err:
                delay = retry_delay_s(self.settings, attempt, None) \
                    if op.retryable_on_lost_connection else None
                if delay is None:
                    raise transport_error(err) from err
            else:
                delay = retry_delay_s(self.settings, attempt, response)
                if delay is None:
                    return response
            yield Sleep(delay)

    def call(self, op: Op[T], timeout_s: float | None = None) -> Plan[T]:
        """`op`'s value; its problem raised as its class."""
        return decode(op, (yield from self.answer(op, timeout_s)))

    def followed(self, op: Op[dict[str, Any]]) -> Plan[dict[str, Any]]:
        """A sync call's (or lifecycle operation's) answer; one that outlasted the API's sync wait
        (202 with its job) is waited for, its problem raised if it failed."""
        response = yield from self.answer(op)
        if response.status == 202:
            return job_outcome((yield from self.wait(decode(op, response)["id"])))
        return decode(op, response)

    def wait(self, job: Job | str, timeout_s: float | None = None) -> Plan[Job]:
        """Long-poll until the job ends; JobNotFinished after `timeout_s` (None: no limit)."""
        job_id = job_id_of(job)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = LONG_POLL_S if deadline is None else min(LONG_POLL_S, deadline - time.monotonic())
            current = yield from self.call(job_op(job_id, max(left, 0.001)), timeout_s=left + 30)
            if current.done:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise JobNotFinished(current)

    def result(self, job: Job | str, timeout_s: float | None = None) -> Plan[dict[str, Any]]:
        return job_outcome((yield from self.wait(job, timeout_s)))

    def cancel(self, job: Job | str) -> Plan[Job]:
        return self.call(cancel_op(job_id_of(job)))

    def completions(self, jobs: Iterable[Job | str]) -> list[Feed[Job]]:
        """`as_completed`'s waits: the jobs in the order they are expected to end, cut into runs of
        WAIT_CHUNK_IDS neighbours, one feed per run, to be followed in that order. Neighbours end
        at about the same time, so one wait answers several of them; a run is followed only
        once those before it free a slot, so each wait lists few ids (the API reads every listed
        job per wait) and is not woken by jobs far off."""
        ids = [job_id_of(job) for job in expected_order(jobs)]
        return [Completions(self, ids[i:i + WAIT_CHUNK_IDS]) for i in range(0, len(ids), WAIT_CHUNK_IDS)]

    def pages(self, page: Callable[[str], Op[Page[T]]]) -> Feed[T]:
        return Pages(self, page)

    def events(self, job: Job | str) -> Feed[OutputChunk | Job]:
        return JobEvents(self, job_id_of(job))


class Pages(Feed[T]):
    """A listing, a page per request; `page(cursor)` is the request for a page ("" the first)."""

    def __init__(self, plans: Plans, page: Callable[[str], Op[Page[T]]]) -> None:
        self._plans, self._page = plans, page
        self._cursor: str | None = ""

    def next(self) -> Plan[list[T] | None]:
        if self._cursor is None:
            return None
        items, self._cursor = yield from self._plans.call(self._page(self._cursor))
        return items


class Completions(Feed[Job]):
    """Jobs as they end: each `next()` is one POST /v1/jobs:wait for those not yet seen ended."""

    def __init__(self, plans: Plans, job_ids: list[str]) -> None:
        self._plans = plans
        self._pending = dict.fromkeys(job_ids)  # ordered: the expected order is kept

    def next(self) -> Plan[list[Job] | None]:
        if not self._pending:
            return None
        ended = yield from self._plans.call(wait_jobs_op(list(self._pending), LONG_POLL_S),
                                            timeout_s=LONG_POLL_S + 30)
        for job in ended:
            self._pending.pop(job.id, None)
        return ended


class JobEvents(Feed[OutputChunk | Job]):
    """A job's output chunks as they come, then the finished job. A dropped stream is reopened
    from the last event seen (Last-Event-ID), so no chunk is lost or repeated."""

    def __init__(self, plans: Plans, job_id: str) -> None:
        self._plans, self._job_id = plans, job_id
        self._last_id: str | None = None
        self._attempt = 0
        self._body: Any = None  # the open stream's body, None while there is none
        self._parser = EventParser()
        self._ended = False

    def next(self) -> Plan[list[OutputChunk | Job] | None]:
        if self._ended:
            return None
        while True:
            try:
                return (yield from self._chunk_events())
            except TRANSPORT_FAILURES as err:
                self._body = None  # the transport closed its connection
                self._attempt += 1
                delay = retry_delay_s(self._plans.settings, self._attempt, None)
                if delay is None:
                    raise transport_error(err) from err
                yield Sleep(delay)

    def _chunk_events(self) -> Plan[list[OutputChunk | Job]]:
        """The events completed by the stream's next chunk, (re)opening the stream first if needed."""
        if self._body is None:
            yield from self._open()
        chunk = yield Read(self._body)
        if chunk is None:
            self._body = None
            # Ended without the result (the API restarted): reopened where it stopped.
            raise ConnectionResetError("the event stream ended before the job's result")
        items: list[OutputChunk | Job] = []
        for event in self._parser.feed(chunk):
            self._attempt, self._last_id = 0, event.id or self._last_id
            if event.event == "result":
                yield Close(self._body)
                self._ended = True
                items.append(Job.model_validate(event.json()))
                return items
            if event.event == "output":
                items.append(OutputChunk.model_validate(event.json()))
        return items

    def _open(self) -> Plan[None]:
        head, body = yield Open(events_request(self._job_id, self._last_id))
        if head.status >= 400:
            chunks = []
            while (chunk := (yield Read(body))) is not None:
                chunks.append(chunk)
            raise_problem(Response(head.status, head.headers, b"".join(chunks)))
        self._body, self._parser = body, EventParser()
