"""Every row of SUBSTRATE_CONTROL.md's behaviour table: the real client against a real
local_substrate over real gRPC."""

from __future__ import annotations

import asyncio
import errno
import time

import pytest

from common.substrate import (
    ActorStatus,
    AlreadyExists,
    ConfigurationError,
    InvalidArgument,
    NoFreeWorkers,
    NotFound,
    NotSuspended,
    SubstrateBusy,
    SubstrateClient,
    SubstrateUnavailable,
    TemplateMismatch,
)
from local_substrate.store import VersionConflict
from tests.substrate.conftest import ATESPACE, TEMPLATE, Start


async def test_create_is_not_idempotent_and_create_if_absent_checks_the_template(
    start_substrate: Start,
) -> None:
    h = await start_substrate(slots=1)
    await h.client.ensure_atespace(ATESPACE)
    created = await h.client.create_actor(ATESPACE, "a1", TEMPLATE)
    assert created.status is ActorStatus.SUSPENDED and created.latest_snapshot == ""
    # identical arguments: still ALREADY_EXISTS
    with pytest.raises(AlreadyExists):
        await h.client.create_actor(ATESPACE, "a1", TEMPLATE)
    assert (await h.client.ensure_actor(ATESPACE, "a1", TEMPLATE)).actor_id == "a1"
    with pytest.raises(TemplateMismatch):
        await h.client.ensure_actor(ATESPACE, "a1", "other-template")


async def test_missing_atespace_or_template_is_a_configuration_error(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    with pytest.raises(ConfigurationError) as err:
        await h.client.create_actor("nowhere", "a1", TEMPLATE)
    assert not err.value.retryable
    await h.client.ensure_atespace(ATESPACE)
    with pytest.raises(ConfigurationError):
        await h.client.create_actor(ATESPACE, "a1", "no-such-template")


@pytest.mark.parametrize(
    ("atespace", "name"), [(ATESPACE, "Bad_Name"), (ATESPACE, "-x"), ("UPPER", "ok"), (ATESPACE, "a" * 64)]
)
async def test_names_must_be_dns1123_labels(start_substrate: Start, atespace: str, name: str) -> None:
    h = await start_substrate(slots=1)
    await h.client.ensure_atespace(ATESPACE)
    with pytest.raises(InvalidArgument):
        await h.client.create_actor(atespace, name, TEMPLATE)
    with pytest.raises(InvalidArgument):
        await h.client.create_atespace("Not_A_Label")


async def test_unknown_actor_is_not_found(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.client.ensure_atespace(ATESPACE)
    for call in (h.client.get_actor, h.client.resume_actor, h.client.suspend_actor, h.client.delete_actor):
        with pytest.raises(NotFound):
            await call(ATESPACE, "ghost")
    with pytest.raises(NotFound):
        await h.client.get_atespace("ghost")


async def test_resume_of_running_is_ok_unchanged_and_suspend_of_suspended_is_a_noop(
    start_substrate: Start,
) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    running = await h.client.resume_actor(ATESPACE, "a1")
    assert running.status is ActorStatus.RUNNING and running.pod_name == "slot-0"
    again = await h.client.resume_actor(ATESPACE, "a1")
    assert (again.version, again.pod_uid) == (running.version, running.pod_uid)
    suspended = await h.client.suspend_actor(ATESPACE, "a1")
    assert suspended.status is ActorStatus.SUSPENDED and suspended.latest_snapshot
    noop = await h.client.suspend_actor(ATESPACE, "a1")
    assert (noop.version, noop.latest_snapshot) == (suspended.version, suspended.latest_snapshot)


async def test_overlapping_operations_are_aborted_at_once(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    no_retry = SubstrateClient(h.server.address, retry_attempts=1, token_file=str(h.server.layout.token))
    try:
        # given a resume in flight, when a second resume arrives, then it is ABORTED at once
        first = asyncio.create_task(no_retry.resume_actor(ATESPACE, "a1"))
        await _until(lambda: "a1" in h.server.control._busy)  # type: ignore[union-attr]
        with pytest.raises(SubstrateBusy) as err:
            await no_retry.resume_actor(ATESPACE, "a1")
        assert err.value.retryable and "another operation is in progress" in str(err.value)
        assert (await first).status is ActorStatus.RUNNING
        # and the default client retries ABORTED with jitter until it gets through
        results = await asyncio.gather(
            h.client.suspend_actor(ATESPACE, "a1"), h.client.suspend_actor(ATESPACE, "a1")
        )
        assert {r.status for r in results} == {ActorStatus.SUSPENDED}
    finally:
        await no_retry.close()


async def test_no_free_workers_is_capacity_and_succeeds_once_a_slot_frees(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    await h.actor("a2")
    await h.client.resume_actor(ATESPACE, "a1")
    with pytest.raises(NoFreeWorkers) as err:
        await h.client.resume_actor(ATESPACE, "a2")
    assert err.value.retryable
    await h.client.suspend_actor(ATESPACE, "a1")
    assert (await h.client.resume_actor(ATESPACE, "a2")).status is ActorStatus.RUNNING


async def test_delete_only_when_suspended(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    await h.client.resume_actor(ATESPACE, "a1")
    with pytest.raises(NotSuspended) as err:
        await h.client.delete_actor(ATESPACE, "a1")
    assert "is not suspended (status: STATUS_RUNNING)" in str(err.value)
    await h.client.suspend_actor(ATESPACE, "a1")
    await h.client.delete_actor(ATESPACE, "a1")
    with pytest.raises(NotFound):
        await h.client.get_actor(ATESPACE, "a1")


async def test_list_actors_page_size_rules_and_pagination(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.client.ensure_atespace("other")
    names = [f"a{i}" for i in range(7)]
    for n in names:
        await h.actor(n)
    await h.client.create_actor("other", "b0", TEMPLATE)
    for bad in (-1, 1001):
        with pytest.raises(InvalidArgument):
            [a async for a in h.client.list_actors(page_size=bad)]
    paged = [a.name async for a in h.client.list_actors(ATESPACE, page_size=2)]
    assert paged == names
    everything = {(a.atespace, a.name) async for a in h.client.list_actors(page_size=0)}
    assert everything == {(ATESPACE, n) for n in names} | {("other", "b0")}


async def test_list_actors_restarts_after_errors_and_deduplicates(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, faults={"error_rate": {"ListActors": 0.3}, "seed": 7})
    for i in range(6):
        await h.actor(f"a{i}")
    listed = [a.name async for a in h.client.list_actors(ATESPACE, page_size=1)]
    assert sorted(listed) == [f"a{i}" for i in range(6)] and len(listed) == 6


async def test_unavailable_is_retried_with_jitter(start_substrate: Start) -> None:
    h = await start_substrate(slots=1, faults={"error_rate": {"GetAtespace": 0.5}, "seed": 3})
    await h.client.create_atespace(ATESPACE)
    for _ in range(10):
        await h.client.get_atespace(ATESPACE)


@pytest.mark.parametrize("way_out", ["suspend", "resume"])
async def test_a_failed_suspend_is_finished_by_the_next_suspend_or_resume(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch, way_out: str
) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    actor = await h.client.resume_actor(ATESPACE, "a1")
    await h.bash(actor, "echo kept > kept.txt")
    control = h.server.control
    assert control is not None

    def broken(*args: object) -> None:
        raise OSError(errno.ENOSPC, "disk full")

    # given a suspend that fails midway (the snapshot write), the actor stays SUSPENDING
    monkeypatch.setattr(control.snapshots, "write", broken)
    with pytest.raises(Exception, match="disk full"):
        await h.client.suspend_actor(ATESPACE, "a1")
    assert (await h.client.get_actor(ATESPACE, "a1")).status is ActorStatus.SUSPENDING
    monkeypatch.undo()
    # when suspended (the checkpoint is retried) or resumed (it is finished first), no file is lost
    if way_out == "suspend":
        assert (await h.client.suspend_actor(ATESPACE, "a1")).status is ActorStatus.SUSPENDED
    actor = await h.client.resume_actor(ATESPACE, "a1")
    assert (await h.bash(actor, "cat kept.txt"))["stdout"] == "kept\n"


async def test_a_failed_resume_is_retried_by_resuming_again(
    start_substrate: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    control = h.server.control
    assert control is not None

    def broken(*args: object) -> None:
        raise OSError("restore failed")

    monkeypatch.setattr(control, "_restore", broken)
    with pytest.raises(Exception, match="restore failed"):
        await h.client.resume_actor(ATESPACE, "a1")
    stuck = await h.client.get_actor(ATESPACE, "a1")
    assert stuck.status is ActorStatus.RESUMING
    monkeypatch.undo()
    assert (await h.client.resume_actor(ATESPACE, "a1")).status is ActorStatus.RUNNING


async def test_a_cancelled_resume_still_completes(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.actor("a1")
    call = asyncio.create_task(h.client.resume_actor(ATESPACE, "a1"))
    await _until(lambda: "a1" in h.server.control._busy)  # type: ignore[union-attr]
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _until_status(h.client, "a1", ActorStatus.RUNNING)


async def test_list_workers_reflects_slots_and_a_killed_slot_falls_back_to_the_last_snapshot(
    start_substrate: Start,
) -> None:
    h = await start_substrate(slots=2)
    await h.actor("a1")
    actor = await h.client.resume_actor(ATESPACE, "a1")
    await h.bash(actor, "echo before > f.txt")
    await h.client.suspend_actor(ATESPACE, "a1")
    actor = await h.client.resume_actor(ATESPACE, "a1")
    await h.bash(actor, "echo after > f.txt")
    workers = {w.pod: w for w in await h.client.list_workers()}
    assert set(workers) == {"slot-0", "slot-1"}
    assert workers[actor.pod_name].actor_id == "a1" and workers[actor.pod_name].actor_atespace == ATESPACE
    # when the slot dies, the actor is SUSPENDED at its last snapshot (work since is lost)
    await h.server.kill_slot(actor.pod_name)
    assert (await h.client.get_actor(ATESPACE, "a1")).status is ActorStatus.SUSPENDED
    assert all(w.actor_id == "" for w in await h.client.list_workers())
    actor = await h.client.resume_actor(ATESPACE, "a1")
    assert (await h.bash(actor, "cat f.txt"))["stdout"] == "before\n"


async def _until(predicate: object, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.002)


async def _until_status(
    client: SubstrateClient, name: str, status: ActorStatus, timeout_s: float = 30.0
) -> None:
    async with asyncio.timeout(timeout_s):
        while (await client.get_actor(ATESPACE, name)).status is not status:
            await asyncio.sleep(0.01)


async def test_pause_keeps_files_and_a_paused_actor_is_not_deletable(start_substrate: Start) -> None:
    h = await start_substrate(slots=1)
    await h.actor("p1")
    actor = await h.client.resume_actor(ATESPACE, "p1")
    await h.bash(actor, "echo paused > p.txt")
    assert (await h.client.pause_actor(ATESPACE, "p1")).status is ActorStatus.PAUSED
    with pytest.raises(NotSuspended):
        await h.client.delete_actor(ATESPACE, "p1")
    actor = await h.client.resume_actor(ATESPACE, "p1")
    assert (await h.bash(actor, "cat p.txt"))["stdout"] == "paused\n"


async def test_a_version_conflict_is_aborted(start_substrate: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    h = await start_substrate(slots=1)
    await h.actor("v1")
    control = h.server.control
    assert control is not None

    def conflict(record: object) -> None:
        raise VersionConflict("v1")

    monkeypatch.setattr(control.store, "update", conflict)
    async with SubstrateClient(h.server.address, retry_attempts=1,
                                     token_file=str(h.server.layout.token)) as client:
        with pytest.raises(SubstrateBusy, match="concurrent update conflict"):
            await client.update_actor(ATESPACE, "v1", {"pool": "a"})


async def test_injected_latency_and_errors(start_substrate: Start) -> None:
    h = await start_substrate(
        slots=1, faults={"latency_ms": {"ListAtespaces": 80}, "error_rate": {"GetAtespace": 1.0}}
    )
    started = time.monotonic()
    await h.client.list_atespaces()
    assert time.monotonic() - started >= 0.08
    async with SubstrateClient(h.server.address, retry_attempts=2,
                                     token_file=str(h.server.layout.token)) as client:
        with pytest.raises(SubstrateUnavailable, match="injected fault"):
            await client.get_atespace(ATESPACE)
