"""The drift table: what a session's Redis state and its actor's Substrate status disagree on.

Pure functions, no I/O: `session_drift` names the repair for one (session, actor) pair and
`orphan_drift` the one for an actor with our naming and no session. Substrate's status is the
truth for the actor, Redis for jobs and activity (ARCHITECTURE.md, "Session states").
"""

from __future__ import annotations

import re
from enum import StrEnum

from common.actor_names import HASH_HEX, actor_name
from common.substrate import Actor, ActorStatus
from reconciler.store import SessionRow


class Drift(StrEnum):
    """Repair kinds (also the `kind` label of RECONCILER_REPAIRS and the session's `drift`)."""

    #: Redis says running, the actor is SUSPENDED (pod died, self-suspend): processes and
    #: unsnapshotted work are gone. State → lost.
    MEMORY_LOST = "memory_lost"
    #: The actor of a running session vanished. State → lost.
    ACTOR_MISSING = "actor_missing"
    #: The actor RUNS while Redis says it does not (we crashed after resuming). State → running,
    #: activity now, so the idle policy applies.
    ADOPTED = "adopted"
    #: A resume/suspend whose worker is gone left Redis in a transitional state; the actor has
    #: settled. State → the actor's.
    SETTLED = "settled"
    #: The actor stayed RESUMING/SUSPENDING past `stuck_after_s`: the same operation again.
    STUCK_RESUMING = "stuck_resuming"
    STUCK_SUSPENDING = "stuck_suspending"
    #: Destroyed in Redis (snapshot not kept), the actor remains: suspend and delete it.
    DESTROY_FINISHED = "destroy_finished"
    #: An actor with our naming and no session: suspended, then deleted after a grace period.
    ORPHAN_SUSPENDED = "orphan_suspended"
    ORPHAN_DELETED = "orphan_deleted"


#: Redis states that mean "the actor should not be running" (a RUNNING actor is adopted).
_NOT_RUNNING = frozenset({"new", "suspended", "resuming", "lost"})

_HEX_TAIL = re.compile(rf"[0-9a-f]{{{HASH_HEX}}}")


def naming_prefix(environment: str) -> str:
    """`s-{slug}-`: how every actor name of the environment starts (see common.actor_names)."""
    return actor_name(environment, "")[:-HASH_HEX]


def is_ours(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `name` has the shape `actor_name` gives one of these environments' sessions."""
    return any(name.startswith(p) for p in prefixes) and bool(_HEX_TAIL.fullmatch(name[-HASH_HEX:]))


def stuck_drift(actor: Actor) -> Drift | None:
    if actor.status is ActorStatus.RESUMING:
        return Drift.STUCK_RESUMING
    if actor.status is ActorStatus.SUSPENDING:
        return Drift.STUCK_SUSPENDING
    return None


def session_drift(row: SessionRow, actor: Actor | None, stuck: bool) -> Drift | None:
    """The repair for a session nobody owns, given its actor (None = absent); None = in sync.

    `stuck`: the actor has been RESUMING/SUSPENDING for longer than the threshold.
    """
    if row.leased or not row.exists:
        return None
    if row.state == "destroyed":
        return _destroyed(row, actor, stuck)
    if actor is None:
        # Only a running session loses something; a parked one gets its actor back on resume.
        return Drift.ACTOR_MISSING if row.state == "running" else None
    if actor.status is ActorStatus.RUNNING:
        stale_suspend = row.state == "suspending" and not row.queued
        return Drift.ADOPTED if row.state in _NOT_RUNNING or stale_suspend else None
    if actor.status is ActorStatus.SUSPENDED:
        return _suspended(row)
    return stuck_drift(actor) if stuck else None


def _destroyed(row: SessionRow, actor: Actor | None, stuck: bool) -> Drift | None:
    # A queued job may be about to use the session again: its worker decides, not us.
    if actor is None or row.snapshot_kept or row.queued:
        return None
    if actor.status in (ActorStatus.RESUMING, ActorStatus.SUSPENDING):
        return stuck_drift(actor) if stuck else None
    return Drift.DESTROY_FINISHED


def _suspended(row: SessionRow) -> Drift | None:
    if row.state == "running":
        return Drift.MEMORY_LOST
    # A resume or suspend whose job is gone (no owner, nothing queued) left a stale state.
    if row.state in ("resuming", "suspending") and not row.queued:
        return Drift.SETTLED
    return None


def orphan_drift(actor: Actor, stuck: bool, orphan_for_s: float, delete_after_s: float) -> Drift | None:
    """The repair for an orphan actor seen as one for `orphan_for_s` seconds."""
    if actor.status is ActorStatus.RUNNING:
        return Drift.ORPHAN_SUSPENDED
    if actor.status is ActorStatus.SUSPENDED:
        return Drift.ORPHAN_DELETED if delete_after_s > 0 and orphan_for_s >= delete_after_s else None
    return stuck_drift(actor) if stuck else None
