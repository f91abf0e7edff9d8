"""The worker's job handlers, one per job kind, looked up in a table.

A handler returns the job's result body (exactly what the sync route answers) or raises a queue
outcome: `RetryLater` for infrastructure failures (kept at the head of the FIFO), `JobFailed`
with a problem for permanent ones, `JobCancelled` when a cancel request stopped the execution.
A tool's own failure (exit 1, file not found) is a successful job whose result says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from common.capacity import FLEET_PARKS, SuspendedBy
from common.config import Config
from common.guest_client import ActorMismatch, GuestClient, GuestError, GuestUnavailable
from common.guest_protocol import SESSION_TOKEN_ENV, Limits
from common.logs import log_context
from common.metrics import GUEST_CALL_LATENCY, Children
from common.queue import JobCancelled, JobContext, JobFailed, JobKind, RetryLater
from common.secret_box import SEALED_ENV_KEY, SecretBox, SecretError, load_key
from common.tool_calls import ToolCall, render_result
from workers.actors import ActorKeeper, problem
from workers.session_identity import SessionIdentity

log = logging.getLogger("atefleet.worker")

Handler = Callable[[JobContext], Awaitable[dict[str, Any]]]
#: Job kinds that leave their session running, so a park candidate once idle (see session_idle).
IDLE_AFTER = frozenset({JobKind.TOOL, JobKind.RESUME})


class GuestGone(Exception):
    """The guest did not answer, or answers for another session: its actor is not ours anymore."""


class JobHandlers:
    def __init__(self, config: Config, actors: ActorKeeper, secret_box: SecretBox) -> None:
        self.config = config
        self.actors = actors
        self.secret_box = secret_box
        #: What each environment sends the guest as `limits`, built once (model_dump costs µs).
        self._limits: dict[str, Limits] = {
            env.name: cast(Limits, env.limits.model_dump(exclude={"max_processes"}))
            for env in config.environments
        }
        self._latency = Children(GUEST_CALL_LATENCY)
        self.identity = SessionIdentity(config, actors.substrate, load_key(config.state_dir))
        self._table: dict[JobKind, Handler] = {
            JobKind.RESUME: self.resume,
            JobKind.SUSPEND: self.suspend,
            JobKind.SUSPEND_IF_IDLE: self.suspend_if_idle,
            JobKind.DESTROY: self.destroy,
            JobKind.TOOL: self.tool_call,
        }

    async def __call__(self, ctx: JobContext) -> dict[str, Any]:
        job = ctx.job
        with log_context(job=job.id, session=job.session, principal=job.principal):
            try:
                return await self._table[job.kind](ctx)
            except RetryLater as err:
                log.warning("job will be retried", extra={"fields": {"reason": err.reason,
                                                                      "attempts": job.attempts}})
                raise
            except JobFailed as err:
                log.warning("job failed", extra={"fields": {"problem": err.problem.get("type"),
                                                             "detail": err.problem.get("detail")}})
                raise
            finally:
                if job.kind in IDLE_AFTER:
                    self.actors.session_idle(job.session)

    # -- lifecycle -----------------------------------------------------------------------------

    async def resume(self, ctx: JobContext) -> dict[str, Any]:
        return await self.actors.resume(ctx)

    async def suspend(self, ctx: JobContext) -> dict[str, Any]:
        return await self.actors.suspend(ctx, force=bool(ctx.job.payload.get("force")), by=SuspendedBy.CLIENT)

    async def destroy(self, ctx: JobContext) -> dict[str, Any]:
        return await self.actors.destroy(ctx, keep_snapshot=bool(ctx.job.payload.get("keep_snapshot")))

    async def suspend_if_idle(self, ctx: JobContext) -> dict[str, Any]:
        """A park the fleet asked for: the reconciler's idle suspension, or a pressure park a
        resume waiting for a Substrate worker asked for (payload `reason`). Re-checked under the
        lease, so a call that came first wins."""
        by = SuspendedBy(ctx.job.payload.get("reason") or SuspendedBy.IDLE)
        result: dict[str, Any] = {}
        try:
            result = await self._park(ctx, by)
            return result
        finally:
            if by is SuspendedBy.PRESSURE:
                parked = result.get("parked") is True
                await asyncio.gather(self.actors.capacity.park_finished(ctx.job.session),
                                     self.actors.park_ended(ctx.job.session, freed=parked))

    async def _park(self, ctx: JobContext, by: SuspendedBy) -> dict[str, Any]:
        env = self.config.environment(ctx.job.environment)
        # Read together: the session holds a Substrate worker until its park gets there.
        session, queued = await asyncio.gather(ctx.session(), ctx.peek_next_job())
        if session.get("state") == "suspending" and session.get("suspended_by") in FLEET_PARKS:
            # A park whose worker died midway: finish it (the actor may hold a worker still).
            result = await self.actors.suspend(ctx, force=True, by=SuspendedBy(session["suspended_by"]))
            return {**result, "status": "ok", "parked": True}
        idle_after_s = self.config.workers.min_idle_s if by is SuspendedBy.PRESSURE else (
            env.idle_timeout_s if env else 0)
        last = float(session.get("last_activity") or 0)
        at_end = bool(ctx.job.payload.get("at_end"))
        quiet_s = idle_after_s - (time.time() - last)
        if at_end and quiet_s > 0:
            # Asked by the session's own call as it ended: it holds the lease, so the quiet it is
            # owed is spent here (a call sent meanwhile waits this long at most, then runs).
            await asyncio.sleep(quiet_s)
            queued = await ctx.peek_next_job()
        reason = None
        if session.get("state") != "running":
            reason = f"session is {session.get('state', 'new')}"
        # An at_end park held the lease all along and waited its quiet out above; `last` is
        # stored to the millisecond, so comparing again could refuse it by a rounding.
        elif not at_end and ((not idle_after_s and by is not SuspendedBy.PRESSURE)
                             or time.time() - last < idle_after_s):
            reason = "session was active since the idle check"
        elif queued is not None:
            reason = "more work is queued"
        elif env and not env.suspend_with_background and await self.actors.background_processes(ctx, session):
            reason = "background processes are running"
        if reason:
            return {"status": "skipped", "reason": reason}
        result = await self.actors.suspend(ctx, force=True, by=by)
        return {**result, "status": "ok", "parked": True, "suspended_by": str(by),
                "idle_suspended": by is SuspendedBy.IDLE, **({"at_end": True} if at_end else {})}

    # -- tool calls ----------------------------------------------------------------------------

    async def tool_call(self, ctx: JobContext) -> dict[str, Any]:
        payload = ctx.job.payload
        auto_resume = bool(payload.get("auto_resume"))
        guest = await self.actors.ensure_running(ctx, auto_resume)
        try:
            result = await self._execute(ctx, guest)
        except GuestGone:
            # The cached guest vanished (actor suspended or its pod died behind our back): ask
            # Substrate afresh once, resuming if allowed; the guest journal makes a re-sent start
            # of the same job id attach rather than run twice.
            self.actors.forget(ctx.job.session)
            guest = await self.actors.ensure_running(ctx, auto_resume, fresh=True)
            try:
                result = await self._execute(ctx, guest)
            except GuestGone as err:
                self.actors.forget(ctx.job.session)
                raise RetryLater(f"guest unavailable: {err}") from err
        self.actors.guest_answered(ctx.job.session)
        tool, arguments = payload["name"], payload.get("arguments") or {}
        if tool == "process" or (tool == "bash" and arguments.get("background")):
            await self._record_background(ctx, guest)
        if auto_resume and not await self._next_call_resumes(ctx) \
                and not await self.actors.background_processes(ctx, await ctx.session()):
            # Seed semantics: resume before, suspend after; skipped when the next queued job
            # would resume again at once (coalescing saves a snapshot and a restore), and while
            # background processes run (the session then stays up; idle suspension applies).
            await self.actors.suspend(ctx, force=True, by=SuspendedBy.AUTO_RESUME)
        elif not auto_resume and await self.actors.resumes_wait():
            await self.actors.park_at_end(ctx)
        return render_result(ToolCall.from_job_payload(payload), result)

    async def _record_background(self, ctx: JobContext, guest: GuestClient) -> None:
        """Keep the session's running background processes on its record: `GET session` shows
        them, and a park or auto-resume suspend asks the guest only when it lists some."""
        running = [{"process_id": p["process_id"], "pid": p["pid"], "command": p["command"][:200],
                    "started_at": p["started_at"]}
                   for p in await guest.list_processes() if p["status"] == "running"]
        await ctx.update_session(background_processes=json.dumps(running))

    async def _next_call_resumes(self, ctx: JobContext) -> bool:
        nxt = await ctx.peek_next_job()
        return nxt is not None and nxt.kind == JobKind.TOOL and bool(nxt.payload.get("auto_resume"))

    async def _env_variables(self, ctx: JobContext) -> dict[str, str]:
        """The call's env vars, opened from their sealed form (kept in Redis until the job ends,
        so a retried start gets them too). Declared but gone: the job fails rather than run
        without them."""
        if not ctx.job.payload.get("env_names"):
            return {}  # nothing sealed: skip the round trip
        secrets = await ctx.take_secrets()
        if not secrets or SEALED_ENV_KEY not in secrets:
            raise JobFailed(problem(500, "secrets_missing", "Env variables missing",
                                    "the call's env variables are no longer stored; it was not run"))
        try:
            return self.secret_box.open(secrets[SEALED_ENV_KEY])
        except SecretError as err:
            raise JobFailed(problem(500, "secrets_unreadable", "Env variables unreadable", str(err))) from err

    async def _session_token(self, ctx: JobContext) -> str:
        """The session's identity token for its actor's current incarnation (see SessionIdentity)."""
        async def owner() -> str:
            # Read by this job already when it resumed the actor (a wake mints a token at once).
            seen = ctx.last_session if ctx.last_session is not None else await ctx.session()
            return seen.get("own") or ctx.job.principal

        job = ctx.job
        return await self.identity.token(job.environment, job.session_id,
                                         self.actors.incarnation(job.session), owner)

    async def _execute(self, ctx: JobContext, guest: GuestClient) -> dict[str, Any]:
        env = self.config.environment(ctx.job.environment)
        payload = ctx.job.payload
        limits = self._limits.get(ctx.job.environment)
        tool = str(payload["name"])
        started = time.monotonic()

        async def on_output(stream: str, data: str) -> None:
            await ctx.append_output(stream, data)

        env_vars = await self._env_variables(ctx)
        env_vars[SESSION_TOKEN_ENV] = await self._session_token(ctx)
        try:
            result, _ = await guest.run(
                ctx.job.id, tool, dict(payload.get("arguments") or {}),
                env=env_vars, limits=limits,
                skills_dir=env.skills_dir if env else None, on_output=on_output, cancelled=ctx.cancelled)
        except (GuestUnavailable, ActorMismatch) as err:
            raise GuestGone(str(err)) from err
        except GuestError as err:
            raise JobFailed(problem(502, "guest_error", "Guest error", str(err))) from err
        self._latency(tool).observe(time.monotonic() - started)
        if ctx.cancel_requested:
            raise JobCancelled("cancelled on request; the process group was killed")
        return dict(result)
