"""A tool call as the fleet keeps it, and the answer bodies rendered from a guest's result.

Shared by the API (which parses requests into a `ToolCall` and answers sync calls) and the
workers (which store the rendered answer as the job's result, so that `GET /v1/jobs/{id}`, the
webhook and the sync route all carry exactly the same body). Parsing lives in `api.tool_calls`.

Answers (`render_result`):
- seed and chat: the seed's `{"type": "function_call_output", "name", "call_id", "output"}` with
  the structured fields (`is_error`, and when the tool reports them `exit_code`, `timed_out`,
  `truncated`, `duration_ms`) next to `output`. Chat items get the seed shape too, on purpose:
  the seed itself accepts exactly that item (its `id` field) and answers it with a
  `function_call_output`, so answering a Chat `{"role": "tool"}` message instead would break
  drop-in clients. A chat client maps `call_id` → `tool_call_id` and `output` → `content`.
- anthropic: exactly `{"type": "tool_result", "tool_use_id", "content", "is_error"}`, nothing
  more, because the Messages API refuses unknown members and clients append the block verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ToolCallFormat = Literal["seed", "anthropic", "chat"]

#: Result members copied next to `output` in the seed-shaped answer, when the tool reports them.
STRUCTURED_FIELDS: tuple[str, ...] = ("exit_code", "timed_out", "truncated", "duration_ms")


@dataclass(frozen=True)
class ToolCall:
    """One tool call, whatever shape it arrived in."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    format: ToolCallFormat
    auto_resume: bool = False
    #: Per-call env vars for bash; secrets, hence hidden from repr.
    env_variables: dict[str, str] = field(default_factory=dict, repr=False)
    is_async: bool = False
    callback_url: str | None = None
    callback_secret_id: str | None = None

    def job_payload(self) -> dict[str, Any]:
        """What the job records (no env var values: those go to the job's secrets)."""
        return {
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
            "format": self.format,
            "auto_resume": self.auto_resume,
            "env_names": sorted(self.env_variables),
        }

    @classmethod
    def from_job_payload(
        cls, payload: Mapping[str, Any], env_variables: Mapping[str, str] | None = None
    ) -> ToolCall:
        """Rebuild the call from `job_payload()` (plus the secrets, when the worker took them)."""
        return cls(
            call_id=str(payload.get("call_id", "")),
            name=str(payload["name"]),
            arguments=dict(payload.get("arguments") or {}),
            format=_format_of(payload.get("format")),
            auto_resume=bool(payload.get("auto_resume", False)),
            env_variables=dict(env_variables or {}),
        )


def _format_of(value: Any) -> ToolCallFormat:
    if value == "anthropic":
        return "anthropic"
    if value == "chat":
        return "chat"
    return "seed"


def render_result(call: ToolCall, result: Mapping[str, Any]) -> dict[str, Any]:
    """The answer body for `call` given the guest's result (`output`, optional structured fields)."""
    output = _output_text(result)
    is_error = _is_error(result)
    if call.format == "anthropic":
        return {"type": "tool_result", "tool_use_id": call.call_id, "content": output, "is_error": is_error}
    answer: dict[str, Any] = {"type": "function_call_output", "name": call.name}
    if call.call_id:  # the seed omits an empty call_id
        answer["call_id"] = call.call_id
    answer["output"] = output
    answer["is_error"] = is_error
    answer.update({k: result[k] for k in STRUCTURED_FIELDS if result.get(k) is not None})
    return answer


def render_tool_not_allowed(call: ToolCall, environment: str) -> dict[str, Any]:
    """The seed's in-band answer (HTTP 200) for a tool the environment does not allow."""
    message = f"Error: tool '{call.name}' is not enabled in environment '{environment}'"
    return render_result(call, {"output": message, "is_error": True})


def _output_text(result: Mapping[str, Any]) -> str:
    output = result.get("output")
    if isinstance(output, str) and output:
        return output
    error = result.get("error")
    if error:  # a result carrying only an error still reads like the seed's "Error: ..."
        return f"Error: {error}"
    return output if isinstance(output, str) else ""


def _is_error(result: Mapping[str, Any]) -> bool:
    flag = result.get("is_error")
    if isinstance(flag, bool):
        return flag
    exit_code = result.get("exit_code")
    return bool(result.get("error")) or bool(result.get("timed_out")) or (exit_code not in (None, 0))
