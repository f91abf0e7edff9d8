"""Tool calls on the wire: the three accepted request shapes in, one `ToolCall`, the answers out.

Accepted bodies (`POST /v1/environments/{env}/sessions/{sid}`), each with the optional envelope
fields `auto_resume` (bool), `env_variables` ([{name, value}]), `async` (bool), `callback_url`
and `callback_secret_id` next to the call's own fields:

- "seed": seed 000's body `{"call_id"|"id", "type": "function_call", "function": {"name",
  "arguments"}}` where `arguments` is a JSON string (an object is accepted too); also the OpenAI
  Responses flat item `{"type": "function_call", "call_id", "name", "arguments"}`.
- "chat": a Chat Completions `tool_calls` item `{"id", "type": "function", "function": {...}}`.
- "anthropic": an Anthropic `tool_use` block `{"type": "tool_use", "id", "name", "input": {...}}`.

Answers (`render_result`, in common.tool_calls because workers render them too):
- seed and chat: the seed's `{"type": "function_call_output", "name", "call_id", "output"}` with
  the structured fields (`is_error`, and when the tool reports them `exit_code`, `timed_out`,
  `truncated`, `duration_ms`) next to `output`. Chat items get the seed shape too, on purpose:
  the seed itself accepts exactly that item (its `id` field, "OpenAI uses id") and answers it with
  a `function_call_output`, so answering a Chat `{"role": "tool"}` message instead would break
  drop-in clients. A chat client maps `call_id` → `tool_call_id` and `output` → `content`.
- anthropic: exactly `{"type": "tool_result", "tool_use_id", "content", "is_error"}`, nothing
  more, because the Messages API refuses unknown members and clients append the block verbatim.

Compatibility choices: unknown members are ignored and `type` is not checked for the seed shape
(the seed's Go decoder does the same); a missing call id is allowed for the seed shape and then
omitted from the answer (the seed's `omitempty`). Unlike the seed, arguments that are not a JSON
object are refused up front with a 422 `invalid_tool_call` problem naming the field (the seed
answered them in-band after resuming the actor); a tool the environment does not allow is
answered in-band exactly like the seed (`render_tool_not_allowed`).

Env var values are secrets: they are kept out of `repr`, out of `job_payload()` and out of the
fingerprint (which hashes them), and travel to the worker only as the job's `secrets`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from api.problems import BadRequest, InvalidToolCall
from common.tool_calls import ToolCall, ToolCallFormat

#: POSIX portable environment variable name (IEEE Std 1003.1, section 8.1).
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Upper bounds on identifiers, so ids stay usable as log fields and header values.
MAX_CALL_ID_CHARS = 256
MAX_TOOL_NAME_CHARS = 128
MAX_ENV_NAME_CHARS = 256
MAX_CALLBACK_URL_CHARS = 2048

# ---------------------------------------------------------------------------------------------
# Parsing


def decode_json_body(raw: bytes) -> Any:
    """Decode a request body; BadRequest (400, as the seed) when it is not JSON."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"the request body is not valid JSON: {err}") from err


def parse_tool_call(body: Any, *, webhook_secret_ids: Collection[str] | None = None) -> ToolCall:
    """Normalize one accepted request body into a ToolCall.

    `webhook_secret_ids`, when given, are the configured secret ids `callback_secret_id` must name.
    Raises InvalidToolCall (422, `field` = dotted path of the offending member).
    """
    if not isinstance(body, dict):
        raise InvalidToolCall("the tool call must be a JSON object", field="body")
    call_format, call_id, name, arguments = _call_fields(body)
    callback_url, callback_secret_id = parse_callback(body, webhook_secret_ids)
    return ToolCall(
        call_id=call_id,
        name=name,
        arguments=arguments,
        format=call_format,
        auto_resume=_optional_bool(body, "auto_resume"),
        env_variables=_env_variables(body.get("env_variables")),
        is_async=_optional_bool(body, "async"),
        callback_url=callback_url,
        callback_secret_id=callback_secret_id,
    )


def _call_fields(body: dict[str, Any]) -> tuple[ToolCallFormat, str, str, dict[str, Any]]:
    """(format, call id, tool name, arguments), dispatched on the body's shape."""
    kind = body.get("type")
    if kind == "tool_use":
        return "anthropic", _id(body, ("id",), required=True), _name(body, "name"), _input(body)
    if "function" in body:
        function = body["function"]
        if not isinstance(function, dict):
            raise InvalidToolCall("`function` must be an object {name, arguments}", field="function")
        name = _name(function, "function.name")
        arguments = _arguments(function.get("arguments"), "function.arguments")
        if kind == "function":
            return "chat", _id(body, ("id",), required=True), name, arguments
        return "seed", _id(body, ("call_id", "id"), required=False), name, arguments
    if kind == "function_call" and "name" in body:
        arguments = _arguments(body.get("arguments"), "arguments")
        return "seed", _id(body, ("call_id", "id"), required=False), _name(body, "name"), arguments
    raise InvalidToolCall(
        "not a tool call: expected a `function` object (seed / Chat Completions), a Responses "
        "`function_call` item, or an Anthropic `tool_use` block",
        field="function",
    )


def _id(body: dict[str, Any], keys: tuple[str, ...], *, required: bool) -> str:
    """The first non-empty of `keys` (the seed prefers `call_id`, then `id`)."""
    for key in keys:
        value = body.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) > MAX_CALL_ID_CHARS:
            raise InvalidToolCall(f"`{key}` must be a string of at most {MAX_CALL_ID_CHARS} chars", field=key)
        return value
    if required:
        raise InvalidToolCall(f"`{keys[0]}` is required", field=keys[0])
    return ""


def _name(container: dict[str, Any], where: str) -> str:
    value = container.get("name")
    if not isinstance(value, str) or not value or len(value) > MAX_TOOL_NAME_CHARS:
        raise InvalidToolCall(
            f"the tool name must be a non-empty string of at most {MAX_TOOL_NAME_CHARS} chars", field=where
        )
    return value


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """Arguments as a JSON-object string (OpenAI's wire form) or an object; absent/empty = {}."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise InvalidToolCall(f"the arguments are not valid JSON: {err}", field=where) from err
        if value is None:
            return {}
    if not isinstance(value, dict):
        raise InvalidToolCall("the arguments must be a JSON object", field=where)
    return value


def _input(body: dict[str, Any]) -> dict[str, Any]:
    value = body.get("input")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidToolCall("`input` must be an object", field="input")
    return value


def _optional_bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidToolCall(f"`{key}` must be true or false", field=key)
    return value


def _env_variables(value: Any) -> dict[str, str]:
    """The seed's `[{"name", "value"}]` list → {name: value}; a later duplicate wins, as in the seed."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise InvalidToolCall("`env_variables` must be a list of {name, value}", field="env_variables")
    env: dict[str, str] = {}
    for index, item in enumerate(value):
        name, secret = _env_variable(item, f"env_variables.{index}")
        env[name] = secret
    return env


def _env_variable(item: Any, where: str) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise InvalidToolCall("each env variable must be an object {name, value}", field=where)
    name, value = item.get("name"), item.get("value")
    if not isinstance(name, str) or len(name) > MAX_ENV_NAME_CHARS or not ENV_NAME_PATTERN.fullmatch(name):
        raise InvalidToolCall(
            "the name must match [A-Za-z_][A-Za-z0-9_]* (POSIX) and be at most 256 characters",
            field=f"{where}.name",
        )
    # Values are never echoed back in errors: they are secrets.
    if not isinstance(value, str):
        raise InvalidToolCall("the value must be a string", field=f"{where}.value")
    if "\x00" in value or not _is_utf8_encodable(value):
        raise InvalidToolCall("the value must be UTF-8 text without NUL characters", field=f"{where}.value")
    return name, value


def _is_utf8_encodable(text: str) -> bool:
    """False for lone surrogates (valid in JSON escapes, impossible in an execve environment)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_callback(body: dict[str, Any], secret_ids: Collection[str] | None) -> tuple[str | None, str | None]:
    """`callback_url` and `callback_secret_id` of a request body, checked (any job may have them)."""
    url, secret_id = body.get("callback_url"), body.get("callback_secret_id")
    if url is not None:
        _check_callback_url(url)
    if secret_id is None:
        return url, None
    if url is None:
        raise InvalidToolCall("`callback_secret_id` needs a `callback_url`", field="callback_secret_id")
    if not isinstance(secret_id, str) or (secret_ids is not None and secret_id not in secret_ids):
        raise InvalidToolCall("`callback_secret_id` names no configured secret", field="callback_secret_id")
    return url, secret_id


def _check_callback_url(url: Any) -> None:
    """Shape only; whether the target may be contacted is the webhook deliverer's decision."""
    parts = urlsplit(url) if isinstance(url, str) and len(url) <= MAX_CALLBACK_URL_CHARS else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidToolCall(
            f"`callback_url` must be an absolute http(s) URL of at most {MAX_CALLBACK_URL_CHARS} characters",
            field="callback_url",
        )


# ---------------------------------------------------------------------------------------------
# Answers


# ---------------------------------------------------------------------------------------------
# Idempotency


def fingerprint(call: ToolCall, session: str) -> str:
    """sha256 hex of the canonical request, to tell an Idempotency-Key replay from a reuse.

    `session` is "env/session_id": the same key on another session is another request. Covers the
    call's shape, id, tool, arguments, auto_resume, callback, env var names and a sha256 of each
    value (values themselves are never stored). `async` is left out: it is how the client wants
    the answer delivered, not what runs, so a sync retry of an async submit replays the same job.
    """
    canonical = {
        "v": 1,
        "session": session,
        "format": call.format,
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "auto_resume": call.auto_resume,
        "env": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in call.env_variables.items()},
        "callback_url": call.callback_url,
        "callback_secret_id": call.callback_secret_id,
    }
    # ASCII escapes keep the encoding total, even for lone surrogates inside arguments.
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(encoded.encode()).hexdigest()
