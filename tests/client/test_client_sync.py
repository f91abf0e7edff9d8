"""`Client` and `Session` end to end against the real fleet: every method, sync."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from atefleet.client import Client, Job, OutputChunk, Session, tool_item
from atefleet.client.errors import (
    BackgroundProcessesRunningError,
    InvalidToolCallError,
    JobExpiredError,
    NotFoundError,
    ProblemError,
)
from tests.client.conftest import RunningFleet


@pytest.fixture
def client(fleet: RunningFleet) -> Iterator[Client]:
    with Client(fleet.url) as c:
        yield c


@pytest.fixture
def session(client: Client) -> Iterator[Session]:
    s = client.session("my-env", f"sdk-{uuid.uuid4().hex[:10]}")
    s.resume()
    yield s
    s.destroy()


def test_discovery(client: Client) -> None:
    # When listing environments and tools
    envs = {e.name: e for e in client.environments()}
    openai, anthropic = client.tools("my-env"), client.tools("my-env", "anthropic")
    # Then the configured environment and its allowed tools come back typed
    assert "bash" in envs["my-env"].allowed_tools
    assert {t["function"]["name"] for t in openai} == set(envs["my-env"].allowed_tools)
    assert {t["name"] for t in anthropic} == set(envs["my-env"].allowed_tools)


def test_lifecycle_and_view(client: Client) -> None:
    s = client.session("my-env", f"sdk-life-{uuid.uuid4().hex[:8]}")
    assert s.resume()["status"] == "ok"
    assert s.view().state == "running"
    assert any(i.session == s.sid for i in client.sessions("my-env", page_size=1))
    assert s.suspend()["status"] == "ok"
    assert s.view().state == "suspended"
    assert s.destroy()["status"] == "ok"


def test_every_tool_method(session: Session) -> None:
    # Given a running session, each tool method runs its tool and answers a typed result
    assert session.write_file("dir/a.txt", "one\ntwo\n").is_error is False
    assert session.read_file("dir/a.txt").output == "one\ntwo\n"
    assert session.read_file("dir/a.txt", start_line=2, end_line=2).output == "two\n"
    assert session.read_file("dir/a.txt", encoding="base64").output == "b25lCnR3bwo="
    assert "a.txt" in session.list_dir("dir").output
    assert session.edit("str_replace", "dir/a.txt", old_str="two", new_str="three").is_error is False
    assert session.read_file("dir/a.txt").output == "one\nthree\n"
    assert session.mkdir("made").is_error is False
    assert "type: dir" in session.stat("made").output
    assert session.rm("made").is_error is False
    result = session.bash("echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.is_error) == (3, True)
    assert "out" in result.output and "err" in result.output
    started = session.bash("sleep 30", background=True)
    assert started.is_error is False
    assert "sleep" in session.process("list").output
    assert "hello" in session.list_skills().output
    assert "echo hello" in session.activate_skill("hello").output


def test_env_variables_reach_bash(client: Client) -> None:
    s = client.session("my-env", f"sdk-env-{uuid.uuid4().hex[:8]}", auto_resume=True,
                       env_variables={"MY_SECRET": "s3cr3t"})
    assert s.bash("printf %s \"$MY_SECRET\"").output == "s3cr3t"
    s.destroy()


def test_call_answers_each_model_api_its_own_result_item(session: Session) -> None:
    # OpenAI Responses: a function_call item (with its own fc_ id) → function_call_output
    responses = session.call({"type": "function_call", "id": "fc_1", "call_id": "call_r",
                              "name": "bash", "arguments": '{"command": "echo r"}'})
    assert responses == {"type": "function_call_output", "call_id": "call_r", "output": "r\n"}
    # Chat Completions: a tool_calls item → a role=tool message
    chat = session.call({"id": "call_c", "type": "function",
                         "function": {"name": "bash", "arguments": '{"command": "echo c"}'}})
    assert chat == {"role": "tool", "tool_call_id": "call_c", "content": "c\n"}
    # Anthropic: a tool_use block → the tool_result block
    anthropic = session.call({"type": "tool_use", "id": "toolu_1", "name": "bash",
                              "input": {"command": "echo a"}})
    assert anthropic == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\n", "is_error": False}
    # The seed body → the API's answer as is
    seed = session.call(tool_item("bash", {"command": "echo s"}, call_id="c1"))
    assert seed["output"] == "s\n" and seed["call_id"] == "c1"
    with pytest.raises(ValueError):
        session.call({"type": "message", "content": "not a tool call"})


def test_jobs_submit_wait_result_stream_cancel(client: Client, session: Session) -> None:
    job = session.submit("bash", {"command": "echo one; sleep 0.2; echo two"})
    events = list(client.stream(job))
    assert "".join(e.data for e in events if isinstance(e, OutputChunk)) == "one\ntwo\n"
    assert isinstance(events[-1], Job) and events[-1].state == "succeeded"
    assert client.wait(job).state == "succeeded"
    assert client.result(job)["output"] == "one\ntwo\n"
    assert client.job(job.id).result == events[-1].result
    slow = session.submit("bash", {"command": "sleep 60"})
    cancelled = client.cancel(slow)
    assert client.wait(cancelled).state == "cancelled"
    with pytest.raises(ProblemError) as err:
        client.result(slow)
    assert err.value.slug == "cancelled"


def test_exec_streams_output_then_the_job(session: Session) -> None:
    events = list(session.exec("for i in 1 2 3; do echo $i; done"))
    assert "".join(e.data for e in events if isinstance(e, OutputChunk)) == "1\n2\n3\n"
    assert isinstance(events[-1], Job)


def test_batch_and_as_completed(client: Client, session: Session) -> None:
    calls = [{"environment": "my-env", "session": session.sid, **tool_item("bash", {"command": f"echo {i}"})}
             for i in range(10)]
    jobs = client.batch(calls)
    done = list(client.as_completed(jobs))
    assert sorted(j.id for j in done) == sorted(j.id for j in jobs)
    assert sorted(j.result["output"] for j in done if j.result) == sorted(f"{i}\n" for i in range(10))


def test_problems_raise_their_class(client: Client, session: Session) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.job("ffffffffff0-not-a-job")
    assert missing.value.status == 404 and missing.value.problem.type.endswith("/not_found")
    with pytest.raises(JobExpiredError):
        client.job("00000000001" + "0" * 16)  # a job id made in 1970
    with pytest.raises(InvalidToolCallError) as bad:
        client.run("my-env", session.sid,
                   {"type": "function_call", "function": {"name": "bash", "arguments": "[1]"}})
    assert bad.value.problem.model_extra and bad.value.problem.model_extra["field"] == "function.arguments"
    session.bash("sleep 30", background=True)
    with pytest.raises(BackgroundProcessesRunningError):
        session.suspend()
    assert session.suspend(force=True)["status"] == "ok"


def test_capacity_audit_and_get(client: Client, session: Session) -> None:
    assert isinstance(client.capacity(), dict)
    assert client.get("/healthz")["status"] == "ok"
    records = list(client.audit(session=session.sid, page_size=2))
    assert all(r.get("session") in (None, session.sid) for r in records)


def test_as_completed_over_many_jobs_across_sessions(client: Client) -> None:
    # given: 10 sessions with 10 jobs each, in one batch (session by session)
    sids = [f"many-{i}-{uuid.uuid4().hex[:6]}" for i in range(10)]
    jobs = client.batch([{"environment": "my-env", "session": sid, "auto_resume": True,
                          **tool_item("bash", {"command": f"echo {k}"})} for sid in sids for k in range(10)])
    # when: 4 waits in flight
    done = list(client.as_completed(jobs, parallel=4))
    # then: each job once, ended
    assert sorted(j.id for j in done) == sorted(j.id for j in jobs)
    assert all(j.state == "succeeded" for j in done)
    for sid in sids:
        client.session("my-env", sid).destroy()
