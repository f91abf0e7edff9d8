"""What every route needs, opened once per process: config, Redis, queue, waiter, auth, limiter,
audit log, command policies and stream slots.

Routes get it through `get_fleet`, and the caller through `get_principal`, which also applies the
rate limit, so no route can forget either. The hot routes (one per tool call or lifecycle job)
call `fleet_and_caller` instead: the same checks without FastAPI's dependency solving, which cost
them a quarter of the API's CPU per call; they declare `BEARER_DOC` so the OpenAPI document still
shows their security.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import Authenticator, Principal
from api.ownership import may_see_job
from api.policy import Policies
from api.problems import JobExpired, NotFound, Unauthorized
from api.quotas import StreamSlots
from api.rate_limit import RateLimiter
from common.audit import AuditLog
from common.config import Config, Environment
from common.queue import JobRecord, JobWaiter, Queue
from common.queue.queue import job_id_created_s
from common.redis.client import RedisClient
from common.secret_box import SecretBox


@dataclass(frozen=True)
class Fleet:
    config: Config
    redis: RedisClient
    queue: Queue
    waiter: JobWaiter
    auth: Authenticator
    limiter: RateLimiter
    secret_box: SecretBox
    audit: AuditLog
    policies: Policies
    #: Open SSE streams and long-polls per principal (the `streams_open` quota).
    streams: StreamSlots

    def environment(self, name: str) -> Environment:
        env = self.config.environment(name)
        if env is None:
            raise NotFound(f"environment {name!r} is not configured", environment=name)
        return env

    async def visible_job(self, job_id: str, principal: Principal) -> JobRecord:
        """The job, if it exists and the caller may see it; another principal's job is a 404."""
        job = await self.queue.get_job(job_id)
        if job is None:
            created = job_id_created_s(job_id)
            if created is not None and time.time() - created > self.config.jobs.ttl_s:
                raise JobExpired(f"job {job_id!r} expired (jobs are kept {self.config.jobs.ttl_s:g} s "
                                 "after they end)", job_id=job_id)
            raise NotFound(f"job {job_id!r} does not exist", job_id=job_id)
        if not may_see_job(principal, job):
            await self.audit.record("ownership_denied", principal.id, env=job.environment,
                                    sid=job.session_id, job=job_id, op="job")
            raise NotFound(f"job {job_id!r} does not exist", job_id=job_id)
        return job


async def get_fleet(request: Request) -> Fleet:
    # async on purpose: FastAPI runs plain `def` dependencies in its threadpool (a thread hop
    # per request for a dict lookup).
    fleet: Fleet = request.app.state.fleet
    return fleet


async def fleet_and_caller(request: Request) -> tuple[Fleet, Principal]:
    """The fleet and the authenticated, rate-limited caller (what `get_principal` gives)."""
    fleet: Fleet = request.app.state.fleet
    return fleet, await caller(fleet, request.headers)


FleetDep = Annotated[Fleet, Depends(get_fleet)]


#: Declares the Bearer scheme in the OpenAPI document; the check itself is `Authenticator`'s.
_BEARER = HTTPBearer(auto_error=False)


async def get_principal(
    request: Request, fleet: FleetDep,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> Principal:
    """The authenticated caller, after taking one token of its rate-limit bucket.

    Authentication runs first, so unauthenticated floods are answered 401 without touching any bucket.
    """
    return await caller(fleet, request.headers)


PrincipalDep = Annotated[Principal, Depends(get_principal)]

#: `openapi_extra` of the routes that authenticate through `fleet_and_caller`.
BEARER_DOC: dict[str, Any] = {"security": [{"HTTPBearer": []}]}


async def caller(fleet: Fleet, headers: Mapping[str, str]) -> Principal:
    """The caller of a request with these headers (by lower-case name), authenticated, after
    taking one token of its rate-limit bucket (what `get_principal` gives, for the routes outside
    FastAPI's solving)."""
    try:
        principal = fleet.auth.authenticate(headers.get("authorization"))
    except Unauthorized as err:
        await fleet.audit.record("auth_failure", "", why=err.detail)
        raise
    await fleet.limiter.check(principal.id)
    return principal
