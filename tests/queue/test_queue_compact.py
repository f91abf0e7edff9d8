"""A finished record's compact forms (common/queue/compact.py): results read back exactly as the
handler returned them (members, order, values, JSON types), and on real Redis a finished `echo`
call's record stays small and compact (ziplist / listpack)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from common.job_json import job_to_json
from common.queue import Consumer, JobContext, JobKind, JobState, NewJob, Queue
from common.queue.compact import SAME_AS_RESULT, compact_json, decode_result, encode_result, fold_output
from common.queue.waiter import JobWaiter, parse_note

ECHO = {
    "type": "function_call_output",
    "name": "bash",
    "call_id": "c",
    "output": "7\n",
    "is_error": False,
    "exit_code": 0,
    "timed_out": False,
    "truncated": False,
    "duration_ms": 3.96,
}

RESULTS: list[dict[str, Any]] = [
    ECHO,
    {**ECHO, "is_error": True, "exit_code": 2, "timed_out": True, "truncated": True},
    {k: v for k, v in ECHO.items() if k != "call_id"},  # the seed omits an empty call_id
    {"type": "function_call_output", "name": "read_file", "call_id": "x", "output": "", "is_error": False},
    # Values equal to the usual ones in Python but not in JSON: stored as given.
    {**ECHO, "is_error": 0, "exit_code": False, "duration_ms": 0},
    {**ECHO, "exit_code": 0.0, "timed_out": None},
    {**ECHO, "output": 'é ☃ "quoted" [1,2] {x} \n=\\', "name": "-+.[", "call_id": "s.+++"},
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok", "is_error": False},
    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text"}], "is_error": True},
    # Not a shape: kept as JSON.
    {**ECHO, "extra": 1},
    {"name": "bash", "type": "function_call_output", "output": "x", "is_error": False},  # order
    {"type": "other", "output": "x"},
    {"type": ["function_call_output"]},
    {"status": "ok", "cold_start": True, "duration_ms": 415.2, "actor": "s-x"},
    {},
]


@pytest.mark.parametrize("result", RESULTS)
def test_a_stored_result_reads_back_as_its_json(result: dict[str, Any]) -> None:
    encoded = compact_json(result)
    stored = encode_result(result, encoded)
    back = decode_result(stored)
    # the same JSON text, so the same members, order, values and types
    assert compact_json(back) == encoded
    assert len(stored) <= len(encoded)


def test_an_echo_answer_is_stored_in_a_fifth_of_its_json() -> None:
    stored = encode_result(ECHO, compact_json(ECHO))
    assert stored == 's.+++....+["bash","c","7\\n",3.96]'
    assert len(stored) * 4 < len(compact_json(ECHO))


def test_folded_output_equal_to_the_result_is_not_kept_twice() -> None:
    assert fold_output('["stdout","7\\n"]', ECHO) == SAME_AS_RESULT
    # anything else is kept as it came
    for output in ('["stderr","7\\n"]', '["stdout","7"]', '["stdout","7\\n","stdout","8\\n"]', ""):
        assert fold_output(output, ECHO) == output
    assert fold_output('["stdout","7\\n"]', None) == '["stdout","7\\n"]'
    assert fold_output('["stdout",""]', {**ECHO, "output": ""}) == '["stdout",""]'


def test_a_done_note_carries_the_compact_result() -> None:
    note = f"jid succeeded res {encode_result(ECHO, compact_json(ECHO))}"
    job_id, outcome = parse_note(note)
    assert job_id == "jid" and outcome is not None and outcome.result == ECHO


async def _run(queue: Queue, result: dict[str, Any], chunks: list[tuple[str, str]]) -> str:
    async def handler(ctx: JobContext) -> dict[str, Any]:
        for stream, data in chunks:
            await ctx.append_output(stream, data)
        return result

    res = await queue.enqueue(NewJob("env", "s", JobKind.TOOL, {"name": "bash"}, "p"))
    consumer = Consumer(queue, "w", handler, block_ms=100)
    task = asyncio.create_task(consumer.run())
    waiter = JobWaiter(queue)
    try:
        # a sync caller's wait: the answer comes inline on the done channel
        with waiter.watch(res.job_id) as watch:
            outcome = await watch.outcome(10)
        assert outcome is not None and outcome.state == JobState.SUCCEEDED
        assert compact_json(outcome.result) == compact_json(result)
    finally:
        await waiter.close()
        await consumer.stop()
        await task
    return res.job_id


async def test_a_finished_echo_record_is_small_and_answers_as_before(
    queue: Queue, redis_client: aioredis.Redis
) -> None:
    # given an echo call's answer, its output printed as one stdout chunk
    jid = await _run(queue, ECHO, [("stdout", "7\n")])
    key = f"af:job:{jid}"
    fields = await redis_client.hgetall(key)
    # then the record keeps the answer positionally, the output once, and no payload
    assert fields[b"res"] == b's.+++....+["bash","c","7\\n",3.96]' and fields[b"o"] == b"="
    assert not {b"pl", b"ow", b"cx"} & set(fields)
    assert await redis_client.object("encoding", key) in (b"ziplist", b"listpack")  # 6.2, 7.x
    assert await redis_client.memory_usage(key) < 260
    # and the job reads back exactly: the public JSON, and the output as the stream gave it
    job = await queue.get_job(jid)
    assert job is not None
    assert json.dumps(job_to_json(job)["result"]) == json.dumps(ECHO)
    assert [e[1] for e in await queue.read_output(jid)] == [
        {"stream": "stdout", "data": "7\n"},
        {"event": "end"},
    ]


async def test_a_tenant_output_that_looks_like_the_markers_is_kept_as_printed(queue: Queue) -> None:
    # given output a tenant controls, shaped like the compact forms themselves
    for text in ("=", '["stdout","x"]', 's.+++....+["a"]', "{"):
        result = {**ECHO, "output": text}
        jid = await _run(queue, result, [("stdout", text)])
        job = await queue.get_job(jid)
        assert job is not None and compact_json(job.result) == compact_json(result)
        assert [e[1] for e in await queue.read_output(jid)][0] == {"stream": "stdout", "data": text}
    # and output that differs from the answer's keeps its own chunks
    jid = await _run(queue, ECHO, [("stdout", "7"), ("stderr", "\n")])
    entries = [e[1] for e in await queue.read_output(jid)]
    assert entries == [
        {"stream": "stdout", "data": "7"},
        {"stream": "stderr", "data": "\n"},
        {"event": "end"},
    ]
