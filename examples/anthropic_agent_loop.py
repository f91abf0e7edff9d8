"""An agent loop with Anthropic-shaped tool calls (`tool_use` blocks), driven by a scripted
stand-in model.

Each assistant turn's `tool_use` blocks go through `session.call`, which returns the
`tool_result` block the Messages API expects; they are sent back in one user message, and the
loop repeats until the model stops with `end_turn`. `ScriptedModel` replays fixed turns so the
example runs offline; swap in `anthropic.Anthropic().messages.create(model=..., messages=messages,
tools=client.tools(env, "anthropic"))` to run it for real.

    .venv/bin/python examples/anthropic_agent_loop.py [--api-url URL] [--env my-env]
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from atefleet.client import Client

#: What the stand-in model answers, turn by turn: (stop_reason, content blocks).
SCRIPT: list[tuple[str, list[dict[str, Any]]]] = [
    ("tool_use", [{"type": "text", "text": "Let me look around."},
                  {"type": "tool_use", "id": "toolu_1", "name": "bash",
                   "input": {"command": "echo 42 > n.txt"}},
                  {"type": "tool_use", "id": "toolu_2", "name": "list_dir", "input": {"path": "."}}]),
    ("tool_use", [{"type": "tool_use", "id": "toolu_3", "name": "read_file", "input": {"path": "n.txt"}}]),
    ("end_turn", [{"type": "text", "text": "The file holds 42."}]),
]


class ScriptedModel:
    def __init__(self, turns: list[tuple[str, list[dict[str, Any]]]]) -> None:
        self.turns = iter(turns)

    def respond(self, messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
        return next(self.turns)


def run(api_url: str | None, env: str, model: ScriptedModel) -> list[dict[str, Any]]:
    """The whole conversation once the model ends its turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What number is in n.txt?"}]
    with Client(api_url) as client:
        session = client.session(env, f"agent-{uuid.uuid4().hex[:8]}", auto_resume=True)
        while True:
            stop_reason, content = model.respond(messages)
            messages.append({"role": "assistant", "content": content})
            if stop_reason != "tool_use":
                session.destroy()
                return messages
            results = [session.call(block) for block in content if block["type"] == "tool_use"]
            messages.append({"role": "user", "content": results})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-url", default=None)
    parser.add_argument("--env", default="my-env")
    args = parser.parse_args()
    for message in run(args.api_url, args.env, ScriptedModel(SCRIPT)):
        print(json.dumps(message))


if __name__ == "__main__":
    main()
