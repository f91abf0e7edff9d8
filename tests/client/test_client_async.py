"""`AsyncClient` and `AsyncSession` end to end against the real fleet: every method, asyncio."""

from __future__ import annotations

import asyncio
import uuid

from atefleet.client import AsyncClient, Job, OutputChunk, tool_item
from atefleet.client.errors import NotFoundError
from tests.client.conftest import RunningFleet


async def test_async_session_and_tools(fleet: RunningFleet) -> None:
    async with AsyncClient(fleet.url) as client:
        assert "my-env" in {e.name for e in await client.environments()}
        assert await client.tools("my-env", "anthropic")
        s = client.session("my-env", f"asdk-{uuid.uuid4().hex[:8]}")
        assert (await s.resume())["status"] == "ok"
        assert (await s.view()).state == "running"
        assert [i async for i in client.sessions("my-env") if i.session == s.sid]
        assert (await s.write_file("f.txt", "x")).is_error is False
        assert (await s.read_file("f.txt")).output == "x"
        assert "f.txt" in (await s.list_dir()).output
        assert (await s.edit("view", "f.txt")).is_error is False
        assert (await s.bash("echo hi")).output == "hi\n"
        assert (await s.process("list")).is_error is False
        assert "hello" in (await s.list_skills()).output
        assert (await s.activate_skill("hello")).is_error is False
        assert (await s.mkdir("d")).is_error is False and (await s.stat("d")).is_error is False
        assert (await s.rm("d")).is_error is False
        item = {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "echo a"}}
        assert await s.call(item) == {"type": "tool_result", "tool_use_id": "t1", "content": "a\n",
                                      "is_error": False}
        events = [e async for e in s.exec("echo streamed")]
        assert isinstance(events[0], OutputChunk) and isinstance(events[-1], Job)
        job = await s.submit("bash", {"command": "echo later"})
        assert (await client.wait(job)).state == "succeeded"
        assert (await client.result(job))["output"] == "later\n"
        assert (await client.job(job.id)).done
        slow = await s.submit("bash", {"command": "sleep 60"})
        await client.cancel(slow)
        assert (await client.wait(slow)).state == "cancelled"
        assert (await s.suspend())["status"] == "ok"
        assert (await s.destroy())["status"] == "ok"
        assert isinstance(await client.capacity(), dict)
        assert (await client.get("/healthz"))["status"] == "ok"
        assert isinstance([r async for r in client.audit(session=s.sid, page_size=2)], list)
        try:
            await client.job("ffffffffff0-nope")
        except NotFoundError as err:
            assert err.status == 404
        else:
            raise AssertionError("a missing job must raise NotFoundError")


async def test_as_completed_fans_out_over_many_sessions(fleet: RunningFleet) -> None:
    async with AsyncClient(fleet.url) as client:
        sessions = [client.session("my-env", f"fan-{i}-{uuid.uuid4().hex[:6]}", auto_resume=True)
                    for i in range(4)]
        jobs = await asyncio.gather(*(s.submit("bash", {"command": f"echo {i}"})
                                      for i, s in enumerate(sessions)))
        batch = await client.batch([{"environment": "my-env", "session": sessions[0].sid,
                                     **tool_item("read_file", {"path": "nope"})}])
        done = [j async for j in client.as_completed([*jobs, *batch])]
        assert len(done) == 5 and all(j.done for j in done)
        for s in sessions:
            await s.destroy()


async def test_as_completed_over_many_jobs_across_sessions(fleet: RunningFleet) -> None:
    # given: 20 sessions with 10 jobs each, submitted session by session, and 3 waits in flight
    async with AsyncClient(fleet.url) as client:
        sessions = [client.session("my-env", f"many-{i}-{uuid.uuid4().hex[:6]}", auto_resume=True)
                    for i in range(20)]
        jobs = [await s.submit("bash", {"command": f"echo {k}"}) for s in sessions for k in range(10)]
        # when
        done = [j async for j in client.as_completed(jobs, parallel=3)]
        # then: each job once, ended
        assert sorted(j.id for j in done) == sorted(j.id for j in jobs)
        assert all(j.state == "succeeded" for j in done)
        # and leaving early stops the waits (the slow job's wait must not hold the client)
        slow = await sessions[0].submit("bash", {"command": "sleep 60"})
        quick = await sessions[1].submit("bash", {"command": "echo quick"})
        async for job in client.as_completed([slow, quick], parallel=2):
            assert job.id == quick.id
            break
        await client.cancel(slow)
        await asyncio.gather(*(s.destroy() for s in sessions))
