"""Actor lifecycle as a worker performs it: resume, make sure it runs, suspend, destroy.

Substrate's actor status is the truth for the actor; the session hash in Redis records what we
did (fenced by the lease). A guest address is only ever taken from a fresh RUNNING answer and
cached for the current lease epoch: worker pods and local slots are reused, so an address names
one incarnation (routing.py) and the guest's identity check is the second guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.actor_names import actor_name
from common.capacity import ADMIT_WINDOW, FLEET_PARKS, PARKED_STATES, Capacity, SuspendedBy, Turn
from common.config import Config, Environment
from common.guest_client import GuestClient, GuestError
from common.metrics import LIFECYCLE_LATENCY, PARKS
from common.problem_types import problem_body
from common.queue import (
    JobCancelled,
    JobContext,
    JobFailed,
    JobKind,
    NewJob,
    RetryLater,
    split_session,
)
from common.queue.leases import listen_forever
from common.routing import GuestRouter
from common.substrate import (
    Actor,
    ActorStatus,
    ConfigurationError,
    NoFreeWorkers,
    NotFound,
    SnapshotFailed,
    SubstrateClient,
    SubstrateError,
    TemplateMismatch,
    WorkspaceOverQuota,
)

log = logging.getLogger("atefleet.worker.actors")

#: A guest that answered this recently is used without asking Substrate again (seconds), in the
#: lease right after the one it answered in. Each lease of a session takes the next epoch, so no
#: other worker held the session in between: none suspended it or parked it (a parked sandbox
#: may be frozen, its socket accepting calls it never answers). A pod that died meanwhile leaves
#: a vanished guest, which makes the caller re-resolve; a cached address names one incarnation
#: of this actor (a local socket path carries its pod_uid; the cluster router selects by actor
#: name), and the guest refuses any other actor.
GUEST_TRUST_S = 2.0
#: How often a waiting resume looks at its place (s): the further back, the less often, up to
#: the maximum. One told a freed worker is its own asks Substrate at once, in whichever worker
#: process it waits (Capacity.tell); admitted ones also ask every ADMITTED_RETRY_S (a worker
#: freed by no suspend of the fleet: a cluster's new pod, a told waiter that left). A session of
#: this worker that may have become a park candidate makes one waiter look at once (see
#: session_idle): polling finds candidates of other workers only.
CAPACITY_POLL_S = 0.05
CAPACITY_POLL_MAX_S = 1.0
ADMITTED_RETRY_S = 0.25
#: After a job ends, how much longer than `min_idle_s` before a waiter looks for its session: the
#: job's lease is released one round trip after its handler returns, and a leased session is no
#: park candidate.
IDLE_NUDGE_S = 0.01
#: Principal recorded on the park jobs a waiting resume (or a call ending under pressure) enqueues.
PARK_PRINCIPAL = "capacity"
#: A worker that saw resumes wait this recently asks Redis, as each call ends, whether they still
#: do (see resumes_wait); one that did not, asks nothing: without overcommit a call costs no more.
PRESSURE_MEMORY_S = 10.0
#: How long to wait for an actor another operation left RESUMING/SUSPENDING, seconds.
SETTLE_TIMEOUT_S = 60.0
SETTLE_POLL_S = 0.1


def problem(status: int, slug: str, title: str, detail: str, **ext: Any) -> dict[str, Any]:
    return problem_body(status, slug, title, detail, **ext)


def session_not_running(env: str, sid: str, state: str) -> JobFailed:
    return JobFailed(problem(
        409, "session_not_running", "Session not running",
        f"session {sid!r} in {env!r} is {state}: resume it first, or send the call with auto_resume",
        session_state=state))


@dataclass
class RunningGuest:
    epoch: int
    actor: Actor
    guest: GuestClient
    #: time.monotonic() of the last proof the actor runs: a RUNNING answer or a guest reply.
    verified_at: float


#: The place of a waiter that has not joined the line yet: behind every one that has.
_UNPLACED = (1 << 62, "")


@dataclass
class _Waiter:
    """A resume of this process waiting for a Substrate worker."""

    #: Its key in the line, (unix ms its job was created, session), as in capacity:wait: it
    #: orders this process's waiters at once, where a rank read from Redis may be a poll old.
    place: tuple[int, str] = _UNPLACED
    #: Set when it was told a freed worker is its own (ActorKeeper._tell), and while it asks.
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when a session here may have become a park candidate: look again now (session_idle).
    nudged: asyncio.Event = field(default_factory=asyncio.Event)
    #: The session it asked to park, while that park is in flight: it is given no other
    #: meanwhile (capacity_turn), so parks in flight never outnumber the waiters.
    victim: str | None = None


class ActorKeeper:
    """Owns the Substrate client, the guest router, and the per-epoch guest cache of a worker."""

    def __init__(self, config: Config, substrate: SubstrateClient, router: GuestRouter,
                 capacity: Capacity) -> None:
        self.config = config
        self.substrate = substrate
        self.router = router
        self.capacity = capacity
        #: Told how many of this worker's turns wait for a Substrate worker (the Consumer's
        #: `set_waiting`, wired by workers.main): those turns do not hold its concurrency.
        self.on_waiting: Callable[[int], None] = lambda turns: None
        self._waiting = 0
        #: The resumes of this process waiting for a Substrate worker, by session (see _tell).
        self._waiters: dict[str, _Waiter] = {}
        #: Guests of recently served sessions, least recently used first (bounded, see _remember).
        self._guests: OrderedDict[str, RunningGuest] = OrderedDict()
        self._max_cached = max(64, config.workers.concurrency * 4)
        self._atespaces: set[str] = set()
        #: Until when (monotonic) this worker asks whether resumes wait (see resumes_wait).
        self._pressure_until = 0.0
        #: Sessions whose job now ending asked for its park (park_at_end, then session_idle).
        self._parking_at_end: set[str] = set()
        #: The Substrate is the embedded local one. It frees a suspending actor's running place
        #: once its sandbox is stopped, and holds a resume that comes meanwhile until then (a real
        #: one refuses it); and a park may leave the files held in a frozen sandbox (PARK_KEY).
        self._embedded = not config.ate.ateapi
        #: Pressure parks in flight here that told a waiter before their suspend (_hand_over).
        self._handed: dict[str, tuple[str, int]] = {}
        #: Set once the told channel is subscribed (see listen).
        self.listening = asyncio.Event()

    def _env(self, ctx: JobContext) -> Environment:
        env = self.config.environment(ctx.job.environment)
        if env is None:
            raise JobFailed(problem(404, "not_found", "Environment not configured",
                                    f"environment {ctx.job.environment!r} is no longer configured"))
        return env

    def forget(self, session: str) -> None:
        """Drop the cached guest (lease ended, actor suspended, or the guest stopped answering)."""
        cached = self._guests.pop(session, None)
        if cached is not None:
            asyncio.get_running_loop().create_task(cached.guest.aclose())

    async def close(self) -> None:
        for session in list(self._guests):
            cached = self._guests.pop(session)
            await cached.guest.aclose()

    # -- running guests ------------------------------------------------------------------------

    async def running_guest(self, ctx: JobContext, fresh: bool = False) -> GuestClient | None:
        """The guest of this session's actor if it is RUNNING now, else None.

        A guest cached in this lease epoch, or one that answered within GUEST_TRUST_S, is used
        as is (unless `fresh`). Otherwise the actor is re-read (a fresh status answer); the cached
        connection is kept only if it still points at the same incarnation (`pod_uid` changes on
        every resume), which skips a reconnect and identity bind.
        """
        trusted = None if fresh else self._trusted(ctx)
        if trusted is not None:
            return trusted.guest
        session = ctx.job.session
        cached = self._guests.get(session)
        env = self._env(ctx)
        actor = await self._get(env.atespace, actor_name(env.name, ctx.job.session_id))
        if actor is None or not actor.running:
            self.forget(session)
            return None
        if cached is not None and cached.actor.pod_uid == actor.pod_uid and actor.pod_uid:
            cached.epoch, cached.verified_at = ctx.epoch, time.monotonic()
            self._guests.move_to_end(session)
            return cached.guest
        self.forget(session)
        return await self._bind(ctx, actor)

    def _trusted(self, ctx: JobContext) -> RunningGuest | None:
        """The cached guest when it is trusted without asking Substrate (see running_guest)."""
        cached = self._guests.get(ctx.job.session)
        if cached is None or (cached.epoch != ctx.epoch and (
                ctx.epoch != cached.epoch + 1 or time.monotonic() - cached.verified_at >= GUEST_TRUST_S)):
            return None
        cached.epoch = ctx.epoch
        self._guests.move_to_end(ctx.job.session)
        return cached

    def incarnation(self, session: str) -> str:
        """The incarnation (`pod_uid`, new at every resume) of the session's cached actor, or ""."""
        cached = self._guests.get(session)
        return cached.actor.pod_uid if cached is not None else ""

    def guest_answered(self, session: str) -> None:
        """A guest call succeeded: the actor runs, so the trust window starts again."""
        cached = self._guests.get(session)
        if cached is not None:
            cached.verified_at = time.monotonic()

    async def _bind(self, ctx: JobContext, actor: Actor, probe: bool = True) -> GuestClient:
        """Connect to the guest of a fresh RUNNING answer and check (or bind) its identity.
        `probe` False: a call on it follows at once, and every request names the actor, so that
        call checks (or binds) it instead; a mismatch there is GuestGone like any other."""
        guest = GuestClient(await self.router.address(actor), actor=actor.name)
        try:
            # Proves the guest serves this actor: one serving another (a reused slot or pod)
            # answers ActorMismatch.
            if probe:
                await guest.list_processes()
        except GuestError:
            await guest.aclose()
            raise
        self._remember(ctx.job.session, RunningGuest(ctx.epoch, actor, guest, time.monotonic()))
        return guest

    def _remember(self, session: str, running: RunningGuest) -> None:
        """Cache a guest; past the bound, the least recently used one is closed (its session idle)."""
        self._guests[session] = running
        self._guests.move_to_end(session)
        while len(self._guests) > self._max_cached:
            self.forget(next(iter(self._guests)))

    async def _get(self, atespace: str, name: str) -> Actor | None:
        try:
            return await self.substrate.get_actor(atespace, name)
        except NotFound:
            return None
        except SubstrateError as err:
            raise _infra(err) from err

    # -- lifecycle -----------------------------------------------------------------------------

    async def resume(self, ctx: JobContext, session: dict[str, str] | None = None,
                     call_follows: bool = False) -> dict[str, Any]:
        """Create if absent, resume, wait RUNNING, bind the guest. Answers seed's `{"status":"ok"}`+.
        `session`: the session hash when the caller just read it; `call_follows`: a tool call on
        the guest comes next (see _bind)."""
        env = self._env(ctx)
        name = actor_name(env.name, ctx.job.session_id)
        session = session if session is not None else await ctx.session()
        if session.get("state") == "destroyed" and session.get("snapshot_kept") == "1":
            raise JobFailed(problem(
                409, "session_destroyed", "Session destroyed",
                f"session {ctx.job.session_id!r} was destroyed with its snapshot kept "
                f"(actor {session.get('actor')}); destroy it again without keep_snapshot to reuse the id"))
        started = time.monotonic()
        try:
            actor = await self._resume_actor(ctx, env, name, suspended=session.get("state") == "suspended")
        except WorkspaceOverQuota as err:
            # Substrate stopped the actor (back at its last snapshot); this call is told why. Not
            # a fleet park: a call without auto_resume answers 409 until the session is resumed.
            await ctx.update_session(state="suspended", suspended_by="")
            await self.capacity.suspended(ctx.job.session, SuspendedBy.CLIENT, ctx.job.id)
            raise JobFailed(problem(507, "workspace_over_quota", "Workspace over quota", str(err))) from err
        except SubstrateError as err:
            raise await self._failure(env.atespace, name, err) from err
        await self._bind(ctx, actor, probe=not call_follows)
        took_ms = round((time.monotonic() - started) * 1000, 1)
        cold = not session.get("resumed")
        # Together: the session holds a Substrate worker from here until its next park.
        await asyncio.gather(
            ctx.update_session(state="running", actor=name, resumed="1", cold_start="1" if cold else "0",
                               last_resume_ms=str(took_ms), last_activity=str(time.time()), suspended_by=""),
            self.capacity.resumed(ctx.job.session))
        LIFECYCLE_LATENCY.labels(op="resume_cold" if cold else "resume").observe(took_ms / 1000)
        return {"status": "ok", "cold_start": cold, "duration_ms": took_ms, "actor": name}

    async def _resume_actor(self, ctx: JobContext, env: Environment, name: str, suspended: bool) -> Actor:
        """`suspended`: the session says its last suspend succeeded (it says so only once
        Substrate answered SUSPENDED, and only this session's lease holder acts on the actor), so
        the resume goes ahead without reading the actor first; a missing one takes the long way."""
        if env.atespace not in self._atespaces:
            await self.substrate.ensure_atespace(env.atespace)
            self._atespaces.add(env.atespace)
        if suspended:
            await ctx.update_session(state="resuming", actor=name)
            with contextlib.suppress(NotFound):
                resumed = await self._resume_when_capacity(ctx, env.atespace, name)
                return await self._settle(env.atespace, name, resumed, want=ActorStatus.RUNNING)
        actor = await self._get(env.atespace, name)
        if actor is None:
            await ctx.update_session(state="new", actor=name)
            actor = await self.substrate.ensure_actor(env.atespace, name, env.template)
        if actor.status in (ActorStatus.SUSPENDING, ActorStatus.PAUSING):
            # A suspend that failed midway: Substrate would resume it from the snapshot BEFORE
            # that suspend (work since then lost), so finish the checkpoint first.
            actor = await self.substrate.suspend_actor(env.atespace, name)
            actor = await self._settle(env.atespace, name, actor, want=ActorStatus.SUSPENDED)
        if not actor.running:
            await ctx.update_session(state="resuming", actor=name)
            actor = await self._resume_when_capacity(ctx, env.atespace, name)
        return await self._settle(env.atespace, name, actor, want=ActorStatus.RUNNING)

    async def _resume_when_capacity(self, ctx: JobContext, atespace: str, name: str) -> Actor:
        """Resume; while Substrate has no free worker, wait in the fleet's fair queue (common.capacity)
        up to capacity_wait_s, parking the session idle longest for each waiter, then fail clearly.

        The lease keeps renewing meanwhile, so the session's order holds. A resume that finds a
        queue takes its place behind it instead of asking Substrate first: a freed worker goes to
        the one who waited longest, not to whoever asks next.
        """
        session = ctx.job.session
        # The job's creation time is its place in line: a re-run after its worker died keeps it.
        since_ms = int((ctx.job.created_at or time.time()) * 1000)
        deadline = time.monotonic() + self.config.workers.capacity_wait_s
        # Straight to the queue when it is not empty (fair) or every worker is known busy (a
        # resume would only be refused).
        waiting = await self.capacity.full_or_waiting() and self._wait_begins()
        me = _Waiter()
        self._waiters[session] = me
        turn: Turn | None = None
        try:
            while True:
                if ctx.cancel_requested:
                    raise JobCancelled("cancelled while waiting for a Substrate worker")
                me.nudged.clear()
                # One told a worker is its own asks Substrate at once: a turn first would only
                # give another waiter time to take that worker.
                if waiting and not me.woken.is_set():
                    joining = me.place == _UNPLACED
                    turn = await self.capacity.turn(session, since_ms, me.victim, joining)
                    me.place = (since_ms, session)
                    if not turn.park_in_flight:
                        me.victim = None
                    if turn.park is not None:
                        await self._request_park(ctx, turn.park)
                        me.victim = turn.park
                # Told a park freed a worker for it; else admitted, and not in the turn that just
                # asked for a park (the worker it frees is not free yet).
                if not waiting or me.woken.is_set() or (
                        turn is not None and turn.admitted and turn.park is None):
                    # Marked woken while it asks: a worker freed meanwhile goes to another waiter.
                    me.woken.set()
                    try:
                        return await self.substrate.resume_actor(atespace, name)
                    except NoFreeWorkers:
                        me.woken.clear()
                        if waiting:
                            # Told or not (a mark whose message came while it asked, or was
                            # lost, is Redis's alone), it may be told of the next worker.
                            await self.capacity.refused(session)
                        else:
                            waiting = self._wait_begins()
                            continue
                if time.monotonic() > deadline:
                    raise self._no_capacity(ctx, turn)
                await self._pause(turn, me)
        finally:
            self._waiters.pop(session, None)
            if waiting:
                self._wait_ends()
                await self.capacity.leave(session)

    async def park_ended(self, parked: str, freed: bool) -> None:
        """A pressure park of `parked` ended here (done or skipped). The worker it freed goes to
        the waiter first in line, whichever waiter asked for the park (parks are asked for all
        along the line, so that they overlap; their workers go in the line's order) and in
        whichever worker process it waits; only that waiter is told, so no other asks Substrate
        for it in vain. A waiter here that asked for this park may ask for another at once,
        rather than at its next poll. A park that told a waiter as its suspend began
        (_hand_over) tells nobody else, unless that waiter left without resuming; it tells it
        again if its resume came too early and was refused."""
        for w in self._waiters.values():
            if w.victim == parked:
                w.victim = None
                w.nudged.set()
        handed = self._handed.pop(parked, None)
        if freed:  # else skipped: a call came first, or the session was busy
            await self._tell(handed)

    async def _tell(self, handed: tuple[str, int] | None = None) -> tuple[str, int] | None:
        """A Substrate worker was freed here, or is being freed: tell the waiter it goes to
        (Capacity.tell), here at once, else through the told channel (see listen). Returns it,
        and when it was told."""
        told = await self.capacity.tell(handed)
        if told is not None and told[0] in self._waiters:
            self._told(told[0])
        elif told is not None:
            await self.capacity.announce_told(told[0])
        return told

    def _told(self, session: str) -> None:
        waiter = self._waiters.get(session)
        if waiter is not None:
            waiter.woken.set()

    async def listen(self) -> None:
        """Wake the waiters here that another worker process told (until cancelled; a message
        lost while resubscribing leaves its waiter to its poll)."""
        async def subscribed() -> None:
            self.listening.set()

        await listen_forever(self.capacity.redis, self.capacity.keys.told_channel, self._told,
                             name="capacity listener", on_subscribed=subscribed,
                             on_lost=self.listening.clear)

    async def _hand_over(self, parked: str) -> None:
        """A pressure park of `parked` is about to suspend it. With the embedded Substrate the
        waiter first in line is told now, not when the suspend returns: its resume then runs
        while the parked actor's snapshot is written (park_ended tells nobody else for it)."""
        told = await self._tell() if self._embedded else None
        if told is not None:
            self._handed[parked] = told

    def session_idle(self, session: str) -> None:
        """A job of a running session ended here: once idle `min_idle_s`, the session may be
        parked. Then the waiter here first in line that has no park in flight looks at once,
        rather than at its next poll (up to CAPACITY_POLL_MAX_S later). Not after a job that
        parks its session itself (park_at_end): the waiter would find nothing new."""
        if session in self._parking_at_end:
            self._parking_at_end.discard(session)
        elif self._waiters:
            asyncio.get_running_loop().call_later(self.config.workers.min_idle_s + IDLE_NUDGE_S,
                                                  self._nudge)

    def _nudge(self) -> None:
        front = min((w for w in self._waiters.values() if w.victim is None and not w.woken.is_set()),
                    key=lambda w: w.place, default=None)
        if front is not None:
            front.nudged.set()

    async def _pause(self, turn: Turn | None, me: _Waiter) -> None:
        """Until the waiter should look again: told a worker is its (woken) or a park candidate
        may be there (nudged), else after its poll."""
        timeout_s = _poll_s(turn) if turn is not None and not turn.admitted else ADMITTED_RETRY_S
        waits = [asyncio.ensure_future(e.wait()) for e in (me.woken, me.nudged)]
        _, pending = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()

    def _wait_begins(self) -> bool:
        self._pressure_until = time.monotonic() + PRESSURE_MEMORY_S
        self._waiting += 1
        self.on_waiting(self._waiting)
        return True

    def _wait_ends(self) -> None:
        self._waiting -= 1
        self.on_waiting(self._waiting)

    async def resumes_wait(self) -> bool:
        """Whether resumes wait for a Substrate worker now (asked of Redis only by a worker that
        saw them wait lately: see PRESSURE_MEMORY_S)."""
        if time.monotonic() >= self._pressure_until:
            return False
        return await self.capacity.waiting()

    async def park_at_end(self, ctx: JobContext) -> None:
        """The job of `ctx` ends while resumes wait: park its session right after it. The park
        job goes into the session's own FIFO while the job still holds the lease, so the same
        turn takes it next (no other worker, no wait for a waiter to pick the session) and a
        call sent meanwhile queues behind it and finds it skipped or done."""
        await self._request_park(ctx, ctx.job.session, at_end=True)
        self._parking_at_end.add(ctx.job.session)

    async def _request_park(self, ctx: JobContext, victim: str, at_end: bool = False) -> None:
        """Ask `victim` to park, through its own FIFO: a call of it that came first runs first,
        and the park job re-checks under the lease that the session is still idle."""
        env, sid = split_session(victim)
        payload: dict[str, Any] = {"reason": str(SuspendedBy.PRESSURE), "for": ctx.job.session}
        if at_end:
            payload["at_end"] = True
        await ctx.queue.enqueue(NewJob(
            environment=env, session_id=sid, kind=JobKind.SUSPEND_IF_IDLE, principal=PARK_PRINCIPAL,
            payload=payload))
        if not at_end:
            log.info("pressure park requested", extra={"fields": {"park": victim, "for": ctx.job.session}})

    def _no_capacity(self, ctx: JobContext, turn: Turn | None) -> JobFailed:
        w = self.config.workers
        return JobFailed(problem(
            503, "no_capacity", "No Substrate worker free",
            f"no Substrate worker became free for session {ctx.job.session_id!r} within capacity_wait_s "
            f"({w.capacity_wait_s:g} s): every running session was busy, had background processes, or "
            f"was active within min_idle_s ({w.min_idle_s:g} s); retry later or add workers",
            position=turn.rank if turn is not None else 0))

    async def _settle(self, atespace: str, name: str, actor: Actor, want: ActorStatus) -> Actor:
        """Wait while an operation is in progress (RESUMING/SUSPENDING) until `want` or failure."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while actor.status is not want:
            if actor.status not in (ActorStatus.RESUMING, ActorStatus.SUSPENDING, ActorStatus.PAUSING):
                raise RetryLater(f"actor {name} is {actor.status.value}, expected {want.value}")
            if time.monotonic() > deadline:
                raise RetryLater(f"actor {name} stayed {actor.status.value} for {SETTLE_TIMEOUT_S} s")
            await asyncio.sleep(SETTLE_POLL_S)
            actor = await self.substrate.get_actor(atespace, name)
        return actor

    async def ensure_running(self, ctx: JobContext, auto_resume: bool, fresh: bool = False) -> GuestClient:
        """The session's guest, resuming the actor first when the fleet parked it or
        `auto_resume` asks for it."""
        trusted = None if fresh else self._trusted(ctx)
        if trusted is not None:
            return trusted.guest
        info = await ctx.session()
        state = info.get("state", "new")
        # The fleet's own parks (idle, pressure, after an auto_resume call) are woken by the
        # next call, also after a wake that failed ("resuming": no worker came free in time);
        # only a session its client suspended (or never resumed) answers 409. A parked one is
        # resumed without asking Substrate first (the resume asks anyway).
        if state not in PARKED_STATES or info.get("suspended_by") not in FLEET_PARKS:
            guest = await self.running_guest(ctx, fresh)
            if guest is not None:
                return guest
            if not auto_resume:
                raise session_not_running(ctx.job.environment, ctx.job.session_id,
                                          "suspended" if state == "running" else state)
        await self.resume(ctx, info, call_follows=True)
        cached = self._guests[ctx.job.session]
        return cached.guest

    async def background_processes(self, ctx: JobContext, session: dict[str, str] | None = None,
                                   ) -> list[dict[str, Any]]:
        """The session's running background processes, as its guest lists them. `session`: the
        session hash when the caller read it; one that records none skips the guest call, since
        the call that started a process recorded it before its job ended and this session's
        later jobs run after it (the FIFO)."""
        if session is not None and session.get("background_processes") in (None, "", "[]"):
            return []
        guest = await self.running_guest(ctx)
        if guest is None:
            return []
        return [dict(p) for p in await guest.list_processes() if p["status"] == "running"]

    async def suspend(self, ctx: JobContext, force: bool, by: SuspendedBy) -> dict[str, Any]:
        """Suspend the actor (`by` is recorded as `suspended_by`); refused while background
        processes run unless `force`."""
        env = self._env(ctx)
        name = actor_name(env.name, ctx.job.session_id)
        if not force:
            running = await self.background_processes(ctx)
            if running:
                raise JobFailed(problem(
                    409, "background_processes_running", "Background processes running",
                    f"{len(running)} background process(es) still run; suspend with force=true to stop them",
                    processes=running))
        started = time.monotonic()
        # A trusted guest (used in this lease, or answering just now) proves the actor RUNNING:
        # nothing else acts on it meanwhile; had its pod died, it is SUSPENDED and the suspend
        # a no-op.
        trusted = self._trusted(ctx)
        known = trusted.actor if trusted is not None else None
        self.forget(ctx.job.session)
        freeing = False  # whether this suspend frees a Substrate worker (the actor was not SUSPENDED)
        try:
            actor = known or await self._get(env.atespace, name)
            if actor is not None and actor.status is not ActorStatus.SUSPENDED:
                freeing = True
                # Recorded before the call: a worker that dies midway leaves a park the next call
                # still wakes (and the job's re-run or the reconciler finishes).
                await ctx.update_session(state="suspending", suspended_by=str(by))
                if actor.status is ActorStatus.RESUMING:
                    # Substrate refuses to checkpoint an actor stuck RESUMING until a resume
                    # succeeds; that resume restores the snapshot the failed one started from.
                    actor = await self.substrate.resume_actor(env.atespace, name)
                    await self._settle(env.atespace, name, actor, want=ActorStatus.RUNNING)
                # A pressure park tells the waiter first in line meanwhile (_hand_over).
                hand_over = asyncio.ensure_future(self._hand_over(ctx.job.session)) \
                    if by is SuspendedBy.PRESSURE else None
                try:
                    actor = await self.substrate.suspend_actor(env.atespace, name, park=by in FLEET_PARKS)
                finally:
                    if hand_over is not None:
                        await hand_over
                await self._settle(env.atespace, name, actor, want=ActorStatus.SUSPENDED)
            elif actor is not None and self._embedded and by not in FLEET_PARKS:
                # A client's suspend of a session the fleet parked: the files the park left held
                # in its frozen sandbox are written as a snapshot (a no-op if there are none).
                actor = await self.substrate.suspend_actor(env.atespace, name)
        except SnapshotFailed as err:
            # Substrate put the actor back at its last snapshot and freed its worker (of which a
            # pressure park told a waiter as its suspend began, if it did: _hand_over).
            tell = () if ctx.job.session in self._handed else (self._tell(),)
            await asyncio.gather(ctx.update_session(state="suspended", suspended_by=str(by)), *tell)
            raise JobFailed(problem(507, "snapshot_refused", "Snapshot refused", str(err))) from err
        except SubstrateError as err:
            raise await self._failure(env.atespace, name, err) from err
        took_ms = round((time.monotonic() - started) * 1000, 1)
        LIFECYCLE_LATENCY.labels(op="suspend").observe(took_ms / 1000)
        size = {} if actor is None or actor.snapshot_bytes is None else {
            "snapshot_bytes": str(actor.snapshot_bytes)}
        await ctx.update_session(state="suspended", last_suspend_ms=str(took_ms), background_processes="[]",
                                 suspended_by=str(by), **size)
        # A pressure park's worker goes to the waiter first in line when the park ends (park_ended).
        tell = (self._tell(),) if freeing and by is not SuspendedBy.PRESSURE else ()
        await asyncio.gather(self.capacity.suspended(ctx.job.session, by, ctx.job.id), *tell)
        if by in FLEET_PARKS:
            PARKS.labels(reason=str(by)).inc()
        return {"status": "ok", "duration_ms": took_ms, **_dropped_report(actor)}

    async def destroy(self, ctx: JobContext, keep_snapshot: bool) -> dict[str, Any]:
        """Suspend, then delete the actor, or keep it (and so its snapshot) for forensics."""
        env = self._env(ctx)
        name = actor_name(env.name, ctx.job.session_id)
        await ctx.update_session(state="destroying")
        await self.suspend(ctx, force=True, by=SuspendedBy.CLIENT)
        if keep_snapshot:
            actor = await self._get(env.atespace, name)
            where = {"atespace": env.atespace, "actor": name,
                     "snapshot": actor.latest_snapshot if actor else ""}
            await ctx.update_session(state="destroyed", snapshot_kept="1", snapshot=where["snapshot"])
            return {"status": "ok", "snapshot_kept": True, **where}
        try:
            await self.substrate.delete_actor(env.atespace, name)
        except NotFound:
            pass
        except SubstrateError as err:
            raise await self._failure(env.atespace, name, err) from err
        await ctx.update_session(state="destroyed", snapshot_kept="0", snapshot="", resumed="0")
        return {"status": "ok", "snapshot_kept": False}


    async def _failure(self, atespace: str, name: str, err: SubstrateError) -> Exception:
        """A failed resume/suspend/delete as a job outcome: configuration problems fail the job,
        the rest are retried in place. A FAILED_PRECONDITION that left the actor RESUMING or
        SUSPENDING came from inside the operation (atelet's own codes pass through), not from
        configuration: retried too, so the operation is repeated (the way out of both)."""
        if isinstance(err, ConfigurationError) and not isinstance(err, TemplateMismatch):
            try:
                actor = await self._get(atespace, name)
            except RetryLater:
                actor = None
            if actor is not None and actor.status in (ActorStatus.RESUMING, ActorStatus.SUSPENDING):
                return RetryLater(f"substrate: operation failed midway, actor {actor.status.value}: {err}")
        return _infra(err)


def _poll_s(turn: Turn) -> float:
    """How long a waiting resume not yet admitted sleeps before looking again."""
    return min(CAPACITY_POLL_MAX_S, CAPACITY_POLL_S * (1 + turn.rank - ADMIT_WINDOW + 1))


def _dropped_report(actor: Actor | None) -> dict[str, Any]:
    """What a suspend's answer says of the special files its snapshot left out (when any)."""
    if actor is None or not actor.dropped_count:
        return {}
    return {"dropped_files": {"count": actor.dropped_count, "paths": list(actor.dropped_files)}}


def _infra(err: SubstrateError) -> Exception:
    """Substrate errors: configuration problems fail the job; the rest are retried in place."""
    if isinstance(err, ConfigurationError):
        return JobFailed(problem(503, "substrate_configuration", "Substrate configuration error", str(err)))
    return RetryLater(f"substrate: {type(err).__name__}: {err}")
