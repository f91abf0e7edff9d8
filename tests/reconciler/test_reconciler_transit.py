"""Actors Substrate leaves in transit, as the real server does (SUBSTRATE_CONTROL.md, "Observed on
the real server"), reproduced by local_substrate's fault injection (`upstream_transit`, `arm`):
no file a client wrote before a successful call is lost, and stuck actors are repaired."""

from __future__ import annotations

from typing import Any

import pytest

from common.actor_names import actor_name
from common.queue import JobKind
from common.substrate import ActorStatus, SubstrateError
from common.tool_calls import ToolCall
from tests.reconciler.conftest import ENV, Fleet, wait_for

#: What upstream answers when an operation ends midway: atelet's own codes, and the server's
#: 28 s budget (DEADLINE_EXCEEDED "context deadline exceeded", INTERNAL "workflow cancelled").
MIDWAY_CODES = ["DEADLINE_EXCEEDED", "INTERNAL", "FAILED_PRECONDITION", "INVALID_ARGUMENT", "UNAVAILABLE"]

UPSTREAM = {"faults": {"upstream_transit": True}}
#: No idle suspension: the reconciler's repairs are the only thing acting on these sessions.
NO_IDLE = [{"name": ENV, "idle_timeout_s": 0}]


def _bash(command: str, auto_resume: bool = False) -> dict[str, Any]:
    return ToolCall(call_id="c", name="bash", arguments={"command": command}, format="seed",
                    auto_resume=auto_resume).job_payload()


async def _output(fleet: Fleet, sid: str, command: str) -> str:
    job = await fleet.run(sid, JobKind.TOOL, _bash(command, auto_resume=True))
    assert job.result is not None
    return str(job.result["output"])


@pytest.mark.parametrize("code", MIDWAY_CODES)
async def test_a_suspend_that_fails_midway_loses_no_file(make_fleet: Any, code: str) -> None:
    fleet: Fleet = await make_fleet(local_substrate=UPSTREAM, environments=NO_IDLE,
                                    workers={"max_attempts": 1})
    fleet.start_worker()
    fleet.start_reconciler()  # re-notifies retried jobs
    # given a session whose snapshot holds "one", resumed, and a call that appended "two"
    assert "one" in await _output(fleet, "midway", "echo one > f; cat f")
    await fleet.run("midway", JobKind.RESUME)
    await fleet.run("midway", JobKind.TOOL, _bash("echo two >> f"))
    # when its suspend fails midway with no retries left (the actor stays SUSPENDING; upstream
    # would resume it from the snapshot before that suspend, without "two")
    fleet.server.control.faults.arm("SuspendActor", code)
    await fleet.wait_job(await fleet.enqueue("midway", JobKind.SUSPEND))
    # then the next call finds both lines: the worker finished the suspend before resuming
    assert await _output(fleet, "midway", "cat f") == "one\ntwo\n"
    actor = await fleet.actor("midway")
    assert actor is not None and actor.status is ActorStatus.SUSPENDED


@pytest.mark.parametrize("code", ["DEADLINE_EXCEEDED", "INTERNAL"])
async def test_a_suspend_of_an_actor_stuck_resuming_gets_it_out(make_fleet: Any, code: str) -> None:
    fleet: Fleet = await make_fleet(local_substrate=UPSTREAM, environments=NO_IDLE,
                                    workers={"max_attempts": 1})
    fleet.start_worker()
    fleet.start_reconciler()
    assert "kept" in await _output(fleet, "stuck-r", "echo kept > f; cat f")
    # given a resume that failed midway (no retries left: the actor stays RESUMING)
    fleet.server.control.faults.arm("ResumeActor", code)
    failed = await fleet.wait_job(await fleet.enqueue("stuck-r", JobKind.RESUME))
    assert failed.state == "failed"
    stuck = await fleet.actor("stuck-r")
    assert stuck is not None and stuck.status is ActorStatus.RESUMING
    # when the client suspends it (upstream refuses to checkpoint a RESUMING actor), then the
    # worker resumes it first and the suspend succeeds, files intact
    await fleet.run("stuck-r", JobKind.SUSPEND)
    actor = await fleet.actor("stuck-r")
    assert actor is not None and actor.status is ActorStatus.SUSPENDED
    assert await _output(fleet, "stuck-r", "cat f") == "kept\n"


async def test_the_reconciler_repairs_an_actor_stuck_suspending(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(local_substrate=UPSTREAM, environments=NO_IDLE)
    fleet.start_worker()
    await fleet.run("stuck-s", JobKind.RESUME)
    await fleet.run("stuck-s", JobKind.TOOL, _bash("echo precious > f"))
    # given a suspend behind the fleet's back that failed midway: the actor stays SUSPENDING
    fleet.server.control.faults.arm("SuspendActor", "DEADLINE_EXCEEDED")
    with pytest.raises(SubstrateError):
        await fleet.client.suspend_actor(fleet.atespace, actor_name(ENV, "stuck-s"))
    # when the reconciler runs, then it repeats the suspend (never a resume, which would restore
    # the snapshot before it) and the actor settles SUSPENDED with the file in its snapshot
    fleet.start_reconciler()

    async def suspended() -> bool:
        actor = await fleet.actor("stuck-s")
        return actor is not None and actor.status is ActorStatus.SUSPENDED

    await wait_for(suspended, 30, "the stuck suspend to be repaired")
    assert await _output(fleet, "stuck-s", "cat f") == "precious\n"


async def test_the_reconciler_repairs_an_actor_stuck_resuming(make_fleet: Any) -> None:
    fleet: Fleet = await make_fleet(local_substrate=UPSTREAM, environments=NO_IDLE)
    fleet.start_worker()
    await fleet.run("stuck-r2", JobKind.RESUME)
    await fleet.run("stuck-r2", JobKind.TOOL, _bash("echo precious > f"))
    await fleet.run("stuck-r2", JobKind.SUSPEND)
    # given a resume behind the fleet's back that failed midway: the actor stays RESUMING
    fleet.server.control.faults.arm("ResumeActor", "INTERNAL")
    with pytest.raises(SubstrateError):
        await fleet.client.resume_actor(fleet.atespace, actor_name(ENV, "stuck-r2"))
    # when the reconciler runs, then it repeats the resume and the fleet adopts the running actor
    fleet.start_reconciler()

    async def adopted() -> bool:
        actor = await fleet.actor("stuck-r2")
        return actor is not None and actor.running and await fleet.state_is("stuck-r2", "running")

    await wait_for(adopted, 30, "the stuck resume to be repaired and adopted")
    assert await _output(fleet, "stuck-r2", "cat f") == "precious\n"
