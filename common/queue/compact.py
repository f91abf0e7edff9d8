"""Compact forms of what a finished job's record keeps: its result (`res`) and folded output (`o`).

A finished record is kept for `jobs.ttl_s` (a day by default), so at a steady call rate its bytes
are most of Redis's memory. The tool-call answers that most jobs end with repeat the same member
names and usual values in every record: stored as JSON, an `echo` call's answer was 165 bytes, 5
of them its output. So a result whose members follow a known shape is stored positionally:

    <shape><one mark per member of the shape>[<the marked values, as a JSON array>]

`shape` is a letter (`SHAPES`); each mark says what its member is: `-` absent, `.` the shape's
usual value (`function_call_output`, `false`, `0`), `+` the next value of the array. The seed
answer `{"type":"function_call_output","name":"bash","call_id":"c","output":"7\\n",
"is_error":false,"exit_code":0,"timed_out":false,"truncated":false,"duration_ms":3.96}` is stored
as `s.+++....+["bash","c","7\\n",3.96]` (33 bytes). Reading it back gives the same members, in
the same order, with the same values as the JSON would (`decode_result`); any other result stays
JSON (it starts with `{`), so both forms can be told apart and older records read as before.

Folded output (`o`, a JSON array of stream, data, ...) that is one stdout chunk equal to the
result's `output` is stored as `=` instead of a second copy (`fold_output`, `unfold_output`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Compact JSON, as the queue stores it; one encoder for every call (json.dumps with options
#: builds one per call).
compact_json = json.JSONEncoder(separators=(",", ":")).encode

#: A member with no usual value: always stored when present.
_ANY = object()

#: Result shapes by letter: members in order, each with its usual value. `s`: the seed-shaped
#: answer of a tool call (common/tool_calls.py `render_result`); `a`: the anthropic one.
SHAPES: dict[str, tuple[tuple[str, Any], ...]] = {
    "s": (
        ("type", "function_call_output"),
        ("name", _ANY),
        ("call_id", _ANY),
        ("output", _ANY),
        ("is_error", False),
        ("exit_code", 0),
        ("timed_out", False),
        ("truncated", False),
        ("duration_ms", _ANY),
    ),
    "a": (("type", "tool_result"), ("tool_use_id", _ANY), ("content", _ANY), ("is_error", False)),
}
#: Which shape a result may take, by its `type`.
_SHAPE_OF_TYPE = {members[0][1]: letter for letter, members in SHAPES.items()}

#: `o` when the folded output is one stdout chunk holding exactly the result's `output`.
SAME_AS_RESULT = "="


def _usual(value: Any, usual: Any) -> bool:
    # type() too: False == 0 and 0 == 0.0 in Python, but not in the JSON a client reads back.
    return usual is not _ANY and type(value) is type(usual) and value == usual


def encode_result(result: Mapping[str, Any], encoded: str) -> str:
    """What `res` stores for `result` (`encoded` is its compact JSON): the positional form when
    its members follow a shape, in order, else `encoded` itself."""
    kind = result.get("type")
    letter = _SHAPE_OF_TYPE.get(kind) if isinstance(kind, str) else None
    if letter is None:
        return encoded
    marks, values = [letter], []
    members = iter(result.items())
    pending = next(members, None)
    for name, usual in SHAPES[letter]:
        if pending is None or pending[0] != name:
            marks.append("-")
            continue
        if _usual(pending[1], usual):
            marks.append(".")
        else:
            marks.append("+")
            values.append(pending[1])
        pending = next(members, None)
    if pending is not None:  # a member the shape does not have, or out of its order
        return encoded
    return "".join(marks) + compact_json(values)


def decode_result(stored: str | None) -> dict[str, Any] | None:
    """A result as `encode_result` stored it (or as JSON); None for none."""
    if not stored:
        return None
    if stored[0] == "{":
        loaded: dict[str, Any] = json.loads(stored)
        return loaded
    start = stored.index("[")
    shape = SHAPES[stored[0]]
    values = iter(json.loads(stored[start:]))
    result: dict[str, Any] = {}
    for (name, usual), mark in zip(shape, stored[1:start], strict=True):
        if mark == ".":
            result[name] = usual
        elif mark == "+":
            result[name] = next(values)
    return result


def fold_output(output: str, result: Mapping[str, Any] | None) -> str:
    """What `o` stores for the output `complete` folds (JSON of stream, data, ...)."""
    if result is not None and isinstance(text := result.get("output"), str) and text:
        if output == compact_json(["stdout", text]):
            return SAME_AS_RESULT
    return output


def unfold_output(stored: str | None, result: Mapping[str, Any] | None) -> list[str]:
    """The folded output as stream, data, ... (what `fold_output` was given)."""
    if not stored:
        return []
    if stored == SAME_AS_RESULT:
        return ["stdout", str((result or {}).get("output", ""))]
    flat: list[str] = json.loads(stored)
    return flat
