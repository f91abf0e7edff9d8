"""Model tool-call items in, the matching result item out, for `Session.call`.

The API takes each shape as the body of `POST /v1/environments/{env}/sessions/{sid}` and answers
Anthropic calls with a `tool_result` block and the others with the seed's `function_call_output`
(which carries extra members). Each model API wants its own result item back, with nothing it
does not know, so the answer is reshaped here:

- OpenAI Responses `function_call` item (`type: function_call`, flat `name`): answered
  `{"type": "function_call_output", "call_id", "output"}`;
- Chat Completions `tool_calls` item (`type: function`, `function`): `{"role": "tool",
  "tool_call_id", "content"}`;
- Anthropic `tool_use` block: the API's `{"type": "tool_result", "tool_use_id", "content",
  "is_error"}`, verbatim;
- seed 000 body (`function` without `type: function`): the API's answer, verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Shape = Literal["responses", "chat", "anthropic", "seed"]


def as_item(item: Any) -> dict[str, Any]:
    """A plain dict of a tool-call item (model SDK objects with `model_dump` are dumped)."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_none=True)
        if isinstance(dumped, dict):
            return dumped
    raise TypeError(f"not a tool-call item: {type(item).__name__}")


def shape_of(item: Mapping[str, Any]) -> Shape:
    kind = item.get("type")
    if kind == "tool_use":
        return "anthropic"
    if kind == "function" and "function" in item:
        return "chat"
    if "function" in item:
        return "seed"
    if kind == "function_call":
        return "responses"
    raise ValueError("not a tool call: expected an OpenAI Responses function_call, a Chat Completions "
                     "tool_calls item, an Anthropic tool_use block or a seed body")


def request_body(item: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
    """What the API is sent: the item itself, less the Responses item's own `id` (fc_...), which
    the API would otherwise take for the call id."""
    if shape == "responses":
        return {k: v for k, v in item.items() if k not in ("id", "status")}
    return dict(item)


def result_item(answer: Mapping[str, Any], item: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
    """The result item the model API expects after `item`."""
    if shape == "anthropic" or shape == "seed":
        return dict(answer)
    output = str(answer.get("output", ""))
    if shape == "chat":
        return {"role": "tool", "tool_call_id": item.get("id", ""), "content": output}
    return {"type": "function_call_output", "call_id": item.get("call_id", ""), "output": output}
