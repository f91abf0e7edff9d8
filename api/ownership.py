"""Who owns a session, and what another principal sees of it: nothing.

A session belongs to the principal whose job first reached it (a call or a resume): the enqueue
script records it (`own` in the session hash) and refuses another principal's job for it in the
same step, so the hot path pays no extra round trip. Other routes read the owner with the
session (`GET` a session, listing) or the job (`principal` on the record). A principal with the
`admin` scope sees and acts on every session; in an environment declared `shared`, every
principal that may use the environment may use its sessions (the owner is still recorded).

Every refusal looks like absence (404, as for another principal's job) and is audited.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from api.auth import Principal, matches_pattern
from api.problems import CallbackSecretForbidden, NotFound
from common.config import Environment
from common.queue.models import JobRecord, SessionNotOwned, Tenancy

if TYPE_CHECKING:
    from api.fleet import Fleet


def tenancy_of(principal: Principal, environment: Environment) -> Tenancy:
    """What enqueue checks for this principal's jobs in this environment."""
    if principal.admin:
        return Tenancy.ADMIN
    return Tenancy.SHARED if environment.shared else Tenancy.OWN


def may_see_session(principal: Principal, environment: Environment, owner: str | None) -> bool:
    """Whether the principal may see a session owned by `owner` (no owner yet: anyone may)."""
    return owner is None or owner == principal.id or principal.admin or environment.shared


def may_see_job(principal: Principal, job: JobRecord) -> bool:
    """A job is its submitter's (in a session it may still use), or any admin's."""
    return principal.admin or principal.may_see(job.principal, job.environment, job.session_id)


async def check_access(fleet: Fleet, principal: Principal, env: str, sid: str | None, op: str) -> None:
    """Raise Forbidden (403, audited) unless the principal's credentials cover env (and session)."""
    if not principal.may_use(env, sid):
        await fleet.audit.record("forbidden", principal.id, env=env, sid=sid or "", op=op)
        principal.check(env, sid)


async def session_not_found(fleet: Fleet, principal_id: str, env: str, sid: str, op: str) -> NotFound:
    """The 404 answering another principal's session, audited as an ownership denial."""
    await fleet.audit.record("ownership_denied", principal_id, env=env, sid=sid, op=op)
    return NotFound(f"session {sid!r} does not exist in {env!r}", environment=env, session=sid)


async def refused_enqueue(fleet: Fleet, principal_id: str, err: SessionNotOwned, op: str,
                          batch: bool = False) -> NotFound:
    """The 404 answering an enqueue refused because the session is another principal's (naming
    the call's `index` in a batch)."""
    env, _, sid = err.session.partition("/")
    problem = await session_not_found(fleet, principal_id, env, sid, op)
    if batch:
        problem.extensions["index"] = err.index
    return problem


def may_name_secret(principal: Principal, secret_id: str, scopes: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether the principal may sign its webhooks with this secret: one `webhooks.secret_principals`
    lists for it (ids or patterns), or any as admin (without auth, every caller is)."""
    return principal.admin or any(matches_pattern(p, principal.id) for p in scopes.get(secret_id, ()))


async def check_callback_secret(fleet: Fleet, principal: Principal, secret_id: str | None, op: str) -> None:
    """Raise CallbackSecretForbidden (403, audited) unless the principal may name `secret_id`."""
    if secret_id is None or may_name_secret(principal, secret_id, fleet.config.webhooks.secret_principals):
        return
    await fleet.audit.record("callback_secret_denied", principal.id, op=op, why=secret_id)
    raise CallbackSecretForbidden(f"callback_secret_id {secret_id!r} is not one this principal may use",
                                  callback_secret_id=secret_id)
