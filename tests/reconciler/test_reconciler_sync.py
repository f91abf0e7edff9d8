"""Status sync against a real local Substrate: each drift injected behind Redis's back (or behind
Substrate's API) is repaired by a running reconciler and recorded on the session or in `events`.

Sessions get their Redis state the way a worker writes it (a fenced update under a lease, see
`set_session`) and their actors through the Substrate client, so each case is set up exactly.
"""

from __future__ import annotations

from typing import Any

from common.actor_names import actor_name
from common.substrate import Actor, ActorStatus
from local_substrate.store import Status
from tests.reconciler.conftest import ENV, Fleet, set_session, wait_for

NO_IDLE = [{"name": ENV, "idle_timeout_s": 0}]


async def _drift_events(fleet: Fleet) -> list[dict[str, str]]:
    raw = await fleet.queue.redis.xrange(fleet.queue.keys.events)
    events = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]
    return [e for e in events if "drift" in e]


async def _has_drift(fleet: Fleet, drift: str, **match: str) -> bool:
    return any(e["drift"] == drift and all(e.get(k) == v for k, v in match.items())
               for e in await _drift_events(fleet))


async def _actor(fleet: Fleet, sid: str, running: bool) -> Actor:
    name = actor_name(ENV, sid)
    actor = await fleet.client.ensure_actor(fleet.atespace, name, "default-env-template")
    return await fleet.client.resume_actor(fleet.atespace, name) if running else actor


async def test_pod_death_marks_the_running_session_lost(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(environments=NO_IDLE)
    actor = await _actor(fleet, "dies", running=True)
    await set_session(fleet.queue, "dies", state="running", actor=actor.name)
    fleet.start_reconciler()
    # when the actor's sandbox dies (Substrate silently falls back to the last snapshot)
    await fleet.server.kill_slot(actor.pod_name)
    # then the session is marked lost, with the reason, the drift and an event
    await wait_for(lambda: fleet.state_is("dies", "lost"), 5, "the session to be marked lost")
    session = await fleet.session("dies")
    assert session["drift"] == "memory_lost" and session["lost_reason"].startswith("memory lost")
    assert await _has_drift(fleet, "memory_lost", session=f"{ENV}/dies")


async def test_actor_resumed_behind_our_back_is_adopted_then_idle_policy_applies(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet()  # idle_timeout_s 1
    await set_session(fleet.queue, "adopt", state="suspended", actor=actor_name(ENV, "adopt"))
    # when someone resumes the actor directly (we crashed after resuming)
    await _actor(fleet, "adopt", running=True)
    fleet.start_reconciler()
    # then the session is adopted as running, with activity now, and recorded
    await wait_for(lambda: fleet.state_is("adopt", "running"), 5, "adoption")
    session = await fleet.session("adopt")
    assert session["drift"] == "adopted" and await _has_drift(fleet, "adopted", session=f"{ENV}/adopt")
    # and the idle policy applies to it: a suspend_if_idle job after idle_timeout_s
    await wait_for(lambda: _queued_kinds(fleet, "adopt", "suspend_if_idle"), 5, "the idle job")


async def test_stuck_resuming_and_suspending_actors_are_retried(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(environments=NO_IDLE)
    for sid in ("sr", "ss"):
        await _actor(fleet, sid, running=False)
        await set_session(fleet.queue, sid, state="suspended", actor=actor_name(ENV, sid))
    # when both actors are left mid-operation (a resume/suspend that failed midway)
    fleet.force_status(actor_name(ENV, "sr"), Status.RESUMING)
    fleet.force_status(actor_name(ENV, "ss"), Status.SUSPENDING)
    fleet.start_reconciler()
    # then after stuck_after_s the same operation is retried, and recorded on each session
    await wait_for(lambda: _has_drift(fleet, "stuck_resuming", session=f"{ENV}/sr"), 8, "resume retried")
    await wait_for(lambda: _has_drift(fleet, "stuck_suspending", session=f"{ENV}/ss"), 8, "suspend retried")
    ss = await fleet.actor("ss")
    assert ss is not None and ss.status is ActorStatus.SUSPENDED
    # the retried resume left the actor RUNNING while Redis said suspended: adopted
    await wait_for(lambda: fleet.state_is("sr", "running"), 5, "the resumed actor to be adopted")
    sr = await fleet.actor("sr")
    assert sr is not None and sr.status is ActorStatus.RUNNING


async def test_orphans_are_suspended_then_deleted_and_foreign_actors_left_alone(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(environments=NO_IDLE, reconciler={"orphan_delete_after_s": 1.0})
    ghost = actor_name(ENV, "no-session")
    for name in (ghost, "foreign-actor"):
        await fleet.client.ensure_actor(fleet.atespace, name, "default-env-template")
        await fleet.client.resume_actor(fleet.atespace, name)
    fleet.start_reconciler()

    async def ghost_gone() -> bool:
        return ghost not in {a.name async for a in fleet.client.list_actors(fleet.atespace)}

    await wait_for(ghost_gone, 10, "the orphan to be deleted")
    assert await _has_drift(fleet, "orphan_suspended", actor=ghost)
    assert await _has_drift(fleet, "orphan_deleted", actor=ghost)
    foreign = await fleet.client.get_actor(fleet.atespace, "foreign-actor")
    assert foreign.status is ActorStatus.RUNNING


async def test_destroy_left_unfinished_is_finished_unless_the_snapshot_is_kept(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(environments=NO_IDLE)
    # when Redis says destroyed but the actors remain (a destroy interrupted after its record)
    await _actor(fleet, "gone", running=True)
    await _actor(fleet, "kept", running=False)
    await set_session(fleet.queue, "gone", state="destroyed", snapshot_kept="0")
    await set_session(fleet.queue, "kept", state="destroyed", snapshot_kept="1")
    fleet.start_reconciler()
    # then the unkept one's actor is suspended and deleted (its snapshots with it), the kept one stays
    await wait_for(lambda: _has_drift(fleet, "destroy_finished", session=f"{ENV}/gone"), 8, "the destroy")
    assert await fleet.actor("gone") is None
    assert (await fleet.session("gone"))["drift"] == "destroy_finished"
    assert await fleet.actor("kept") is not None
    assert "drift" not in await fleet.session("kept")


async def test_sessions_a_worker_owns_are_left_alone(make_fleet: Any, redis_client: Any) -> None:
    fleet: Fleet = await make_fleet(environments=NO_IDLE)
    await _actor(fleet, "owned", running=False)
    await set_session(fleet.queue, "owned", state="running", actor=actor_name(ENV, "owned"))
    # given a worker holding the session's lease while Redis and Substrate disagree
    await redis_client.set(fleet.queue.keys.lease(f"{ENV}/owned"), "w:99", px=60_000)
    fleet.start_reconciler()
    await set_session(fleet.queue, "probe", state="running", actor=actor_name(ENV, "probe"))
    # then the unowned probe session is repaired, the owned one is not
    await wait_for(lambda: fleet.state_is("probe", "lost"), 5, "the probe to be repaired")
    assert await fleet.state_is("owned", "running")


async def _queued_kinds(fleet: Fleet, sid: str, kind: str) -> bool:
    ids = await fleet.queue.redis.lrange(fleet.queue.keys.fifo(f"{ENV}/{sid}"), 0, -1)
    jobs = [await fleet.queue.get_job(i.decode()) for i in ids]
    return any(j is not None and j.kind == kind for j in jobs)
