"""Tool call shapes in (seed, Responses flat, Chat Completions, Anthropic), answers out, fingerprints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.problems import BadRequest, InvalidToolCall
from api.tool_calls import decode_json_body, fingerprint, parse_tool_call
from common.tool_calls import ToolCall, render_result, render_tool_not_allowed

SEED_BODY: dict[str, Any] = {
    "auto_resume": True,
    "env_variables": [{"name": "MY_SECRET", "value": "c3ebfdfdk12345..."}],
    "call_id": "call_1",
    "type": "function_call",
    "function": {"name": "bash", "arguments": "{\"command\": \"echo hi && ls\"}"},
}
RESPONSES_BODY = {"type": "function_call", "call_id": "fc_1", "name": "read_file",
                  "arguments": '{"path": "a.txt"}'}
CHAT_BODY = {"id": "call_abc", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
ANTHROPIC_BODY = {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "pwd"}}

BASH_RESULT = {"output": "hi\n", "stdout": "hi\n", "stderr": "", "exit_code": 0, "signal": None,
               "timed_out": False, "truncated": False, "duration_ms": 3.2}


def test_seed_body_exactly_as_in_the_seed_readme() -> None:
    call = parse_tool_call(SEED_BODY)
    assert (call.format, call.call_id, call.name, call.arguments) == (
        "seed", "call_1", "bash", {"command": "echo hi && ls"})
    assert call.auto_resume and call.env_variables == {"MY_SECRET": "c3ebfdfdk12345..."}
    assert not call.is_async and call.callback_url is None


def test_seed_variants() -> None:
    # `id` instead of `call_id` (the seed falls back to it); call_id wins when both are set
    assert parse_tool_call({"id": "x", "function": {"name": "bash"}}).call_id == "x"
    both = parse_tool_call({"call_id": "a", "id": "b", "function": {"name": "bash"}})
    assert both.call_id == "a"
    # arguments as an object, empty string, null, or absent; unknown members ignored like Go does
    assert parse_tool_call({"function": {"name": "bash", "arguments": {"command": "true"}}}).arguments == {
        "command": "true"}
    for arguments in ("", None, "null"):
        assert parse_tool_call({"function": {"name": "list_skills", "arguments": arguments}}).arguments == {}
    assert parse_tool_call({"function": {"name": "list_skills"}, "model": "gpt", "status": "x"}).call_id == ""


def test_responses_flat_item() -> None:
    call = parse_tool_call(RESPONSES_BODY)
    assert (call.format, call.call_id, call.name) == ("seed", "fc_1", "read_file")
    assert call.arguments == {"path": "a.txt"}


def test_chat_completions_item() -> None:
    call = parse_tool_call({**CHAT_BODY, "env_variables": [{"name": "_A1", "value": ""}]})
    assert (call.format, call.call_id, call.name, call.arguments) == ("chat", "call_abc", "list_dir", {})
    assert call.env_variables == {"_A1": ""}


def test_anthropic_tool_use_block() -> None:
    call = parse_tool_call({**ANTHROPIC_BODY, "auto_resume": True})
    assert (call.format, call.call_id, call.name) == ("anthropic", "toolu_01", "bash")
    assert call.arguments == {"command": "pwd"}
    assert call.auto_resume


def test_envelope_fields() -> None:
    call = parse_tool_call({**CHAT_BODY, "async": True, "callback_url": "https://hooks.example/cb",
                            "callback_secret_id": "main"}, webhook_secret_ids={"main"})
    assert call.is_async
    assert (call.callback_url, call.callback_secret_id) == ("https://hooks.example/cb", "main")
    # a later duplicate env var wins, as os.Setenv in a loop does in the seed
    env = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    dupes = parse_tool_call({**CHAT_BODY, "env_variables": env})
    assert dupes.env_variables == {"A": "2"}


MALFORMED: list[tuple[Any, str]] = [
    ([SEED_BODY], "body"),
    ({"type": "function_call", "call_id": "c"}, "function"),
    ({"type": "something"}, "function"),
    ({"function": "bash"}, "function"),
    ({"function": {"arguments": "{}"}}, "function.name"),
    ({"function": {"name": ""}}, "function.name"),
    ({"function": {"name": 7}}, "function.name"),
    ({"function": {"name": "x" * 129}}, "function.name"),
    ({"function": {"name": "bash", "arguments": "{not json"}}, "function.arguments"),
    ({"function": {"name": "bash", "arguments": "[1, 2]"}}, "function.arguments"),
    ({"function": {"name": "bash", "arguments": 5}}, "function.arguments"),
    ({"call_id": 5, "function": {"name": "bash"}}, "call_id"),
    ({"call_id": "c" * 257, "function": {"name": "bash"}}, "call_id"),
    ({"type": "function_call", "name": "bash", "arguments": "nope"}, "arguments"),
    ({"type": "function", "function": {"name": "bash"}}, "id"),
    ({"type": "tool_use", "name": "bash", "input": {}}, "id"),
    ({"type": "tool_use", "id": "t", "input": {}}, "name"),
    ({"type": "tool_use", "id": "t", "name": "bash", "input": "pwd"}, "input"),
    ({**CHAT_BODY, "auto_resume": "true"}, "auto_resume"),
    ({**CHAT_BODY, "async": 1}, "async"),
    ({**CHAT_BODY, "env_variables": {"A": "1"}}, "env_variables"),
    ({**CHAT_BODY, "env_variables": ["A=1"]}, "env_variables.0"),
    ({**CHAT_BODY, "env_variables": [{"name": "1A", "value": "x"}]}, "env_variables.0.name"),
    ({**CHAT_BODY, "env_variables": [{"name": "A-B", "value": "x"}]}, "env_variables.0.name"),
    ({**CHAT_BODY, "env_variables": [{"name": "A B", "value": "x"}]}, "env_variables.0.name"),
    ({**CHAT_BODY, "env_variables": [{"value": "x"}]}, "env_variables.0.name"),
    ({**CHAT_BODY, "env_variables": [{"name": "OK", "value": "x"}, {"name": "B", "value": 3}]},
     "env_variables.1.value"),
    ({**CHAT_BODY, "env_variables": [{"name": "B", "value": "a\x00b"}]}, "env_variables.0.value"),
    ({**CHAT_BODY, "env_variables": [{"name": "B", "value": "\ud800"}]}, "env_variables.0.value"),
    ({**CHAT_BODY, "callback_url": "ftp://x/y"}, "callback_url"),
    ({**CHAT_BODY, "callback_url": "/relative"}, "callback_url"),
    ({**CHAT_BODY, "callback_url": 5}, "callback_url"),
    ({**CHAT_BODY, "callback_secret_id": "main"}, "callback_secret_id"),
    ({**CHAT_BODY, "callback_url": "https://h/cb", "callback_secret_id": "unknown"}, "callback_secret_id"),
]


@pytest.mark.parametrize(("body", "field"), MALFORMED, ids=[f"{i}-{m[1]}" for i, m in enumerate(MALFORMED)])
def test_malformed_calls_are_422_naming_the_field(body: Any, field: str) -> None:
    with pytest.raises(InvalidToolCall) as caught:
        parse_tool_call(body, webhook_secret_ids={"main"})
    assert caught.value.status == 422
    assert caught.value.extensions["field"] == field
    assert caught.value.detail


def test_secret_values_never_appear_in_errors_repr_or_payload() -> None:
    secret = "hunter2-very-secret"
    with pytest.raises(InvalidToolCall) as caught:
        parse_tool_call({**CHAT_BODY, "env_variables": [{"name": "BAD NAME", "value": secret}]})
    assert secret not in json.dumps(caught.value.to_dict())
    call = parse_tool_call({**CHAT_BODY, "env_variables": [{"name": "TOKEN", "value": secret}]})
    assert secret not in repr(call)
    assert secret not in json.dumps(call.job_payload())
    assert call.job_payload()["env_names"] == ["TOKEN"]
    assert secret not in fingerprint(call, "e/s")


def test_decode_json_body() -> None:
    assert decode_json_body(b'{"a": 1}') == {"a": 1}
    for raw in (b"{nope", b"\xff\xfe"):
        with pytest.raises(BadRequest):
            decode_json_body(raw)


# --- answers --------------------------------------------------------------------------------


def test_seed_answer_keeps_the_seed_shape_plus_structured_fields() -> None:
    answer = render_result(parse_tool_call(SEED_BODY), BASH_RESULT)
    assert answer == {"type": "function_call_output", "name": "bash", "call_id": "call_1", "output": "hi\n",
                      "is_error": False, "exit_code": 0, "timed_out": False, "truncated": False,
                      "duration_ms": 3.2}
    # the seed's four members come first, in the seed's order
    assert list(answer)[:4] == ["type", "name", "call_id", "output"]


def test_seed_answer_without_call_id_omits_it_like_the_seed() -> None:
    answer = render_result(parse_tool_call({"function": {"name": "list_skills"}}), {"output": "[]"})
    assert answer == {
        "type": "function_call_output", "name": "list_skills", "output": "[]", "is_error": False}


def test_chat_items_are_answered_in_the_seed_shape() -> None:
    answer = render_result(parse_tool_call(CHAT_BODY), {"output": "a\nb\n"})
    assert answer["type"] == "function_call_output"
    assert answer["call_id"] == "call_abc"


def test_anthropic_answer_is_exactly_a_tool_result_block() -> None:
    call = parse_tool_call(ANTHROPIC_BODY)
    assert render_result(call, BASH_RESULT) == {
        "type": "tool_result", "tool_use_id": "toolu_01", "content": "hi\n", "is_error": False}
    failed = render_result(call, {"output": "Error: exit code 2: boom", "exit_code": 2})
    assert failed["is_error"] is True


@pytest.mark.parametrize(
    ("result", "output", "is_error"),
    [
        ({"output": "x", "is_error": False, "exit_code": 1}, "x", False),  # the guest's flag wins
        ({"output": "x", "exit_code": 1}, "x", True),
        ({"output": "", "timed_out": True}, "", True),
        ({"output": "", "error": "no such file"}, "Error: no such file", True),
        ({"error": "boom", "is_error": True}, "Error: boom", True),
        ({}, "", False),
    ],
)
def test_output_and_is_error_derivation(result: dict[str, Any], output: str, is_error: bool) -> None:
    answer = render_result(parse_tool_call(SEED_BODY), result)
    assert (answer["output"], answer["is_error"]) == (output, is_error)


def test_tool_not_allowed_is_answered_in_band_like_the_seed() -> None:
    call = parse_tool_call({"call_id": "c9", "type": "function_call", "function": {"name": "rm"}})
    assert render_tool_not_allowed(call, "my-env") == {
        "type": "function_call_output", "name": "rm", "call_id": "c9",
        "output": "Error: tool 'rm' is not enabled in environment 'my-env'", "is_error": True}
    anthropic = render_tool_not_allowed(parse_tool_call({**ANTHROPIC_BODY, "name": "rm"}), "my-env")
    assert anthropic["is_error"] is True and anthropic["tool_use_id"] == "toolu_01"


@pytest.mark.parametrize("body", [SEED_BODY, RESPONSES_BODY, CHAT_BODY, ANTHROPIC_BODY],
                         ids=["seed", "responses", "chat", "anthropic"])
def test_job_payload_round_trip_renders_the_same_answer(body: dict[str, Any]) -> None:
    # given a call stored as a job (payload without secrets) and rebuilt by whoever renders the result
    call = parse_tool_call(body)
    rebuilt = ToolCall.from_job_payload(json.loads(json.dumps(call.job_payload())), call.env_variables)
    # then it is the same call (minus delivery options) and answers identically
    assert (rebuilt.call_id, rebuilt.name, rebuilt.arguments, rebuilt.format, rebuilt.auto_resume) == (
        call.call_id, call.name, call.arguments, call.format, call.auto_resume)
    assert rebuilt.env_variables == call.env_variables
    assert render_result(rebuilt, BASH_RESULT) == render_result(call, BASH_RESULT)


# --- fingerprints ---------------------------------------------------------------------------


def test_fingerprint_tells_replays_from_reuse() -> None:
    base = parse_tool_call(SEED_BODY)
    same = parse_tool_call(json.loads(json.dumps(SEED_BODY)))
    assert fingerprint(base, "my-env/s1") == fingerprint(same, "my-env/s1")
    assert len(fingerprint(base, "my-env/s1")) == 64
    # a sync retry of an async submit is the same request
    as_async = parse_tool_call({**SEED_BODY, "async": True})
    assert fingerprint(as_async, "my-env/s1") == fingerprint(base, "my-env/s1")
    changed = [
        {**SEED_BODY, "env_variables": [{"name": "MY_SECRET", "value": "other"}]},
        {**SEED_BODY, "env_variables": [{"name": "OTHER", "value": "c3ebfdfdk12345..."}]},
        {**SEED_BODY, "auto_resume": False},
        {**SEED_BODY, "call_id": "call_2"},
        {**SEED_BODY, "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}},
        {**SEED_BODY, "callback_url": "https://h/cb"},
    ]
    prints = {fingerprint(parse_tool_call(b), "my-env/s1") for b in changed}
    assert len(prints) == len(changed) and fingerprint(base, "my-env/s1") not in prints
    assert fingerprint(base, "my-env/s2") != fingerprint(base, "my-env/s1")


def test_fingerprint_ignores_argument_key_order_and_string_form() -> None:
    as_string = parse_tool_call({"function": {"name": "bash", "arguments": '{"b": 1, "a": 2}'}})
    as_object = parse_tool_call({"function": {"name": "bash", "arguments": {"a": 2, "b": 1}}})
    assert fingerprint(as_string, "e/s") == fingerprint(as_object, "e/s")


# --- over HTTP ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (SEED_BODY, {"type": "function_call_output", "call_id": "call_1"}),
        (RESPONSES_BODY, {"type": "function_call_output", "call_id": "fc_1"}),
        (CHAT_BODY, {"type": "function_call_output", "call_id": "call_abc"}),
        (ANTHROPIC_BODY, {"type": "tool_result", "tool_use_id": "toolu_01"}),
    ],
    ids=["seed", "responses", "chat", "anthropic"],
)
async def test_all_formats_over_http(
    make_client: Any, body: dict[str, Any], expected: dict[str, Any]
) -> None:
    response = await make_client().post("/v1/environments/my-env/sessions/s1", json=body)
    assert response.status_code == 200
    assert expected.items() <= response.json().items()


async def test_malformed_call_over_http_is_a_422_problem(make_client: Any) -> None:
    body = {**SEED_BODY, "function": {"name": "bash", "arguments": "{oops"}}
    response = await make_client().post("/v1/environments/my-env/sessions/s1", json=body)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "https://atefleet.dev/problems/invalid_tool_call"
    assert problem["field"] == "function.arguments"


async def test_body_is_json_whatever_the_content_type_like_the_seed(make_client: Any) -> None:
    # curl -d without -H sends application/x-www-form-urlencoded; the seed decoded JSON anyway
    client = make_client()
    form_typed = await client.post("/v1/environments/my-env/sessions/s1", content=json.dumps(SEED_BODY),
                                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert form_typed.status_code == 200
    not_json = await client.post("/v1/environments/my-env/sessions/s1", content=b"{oops")
    assert not_json.status_code == 400
    assert not_json.json()["type"] == "https://atefleet.dev/problems/bad_request"
