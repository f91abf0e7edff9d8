"""An agent loop with OpenAI Responses-shaped tool calls, driven by a scripted stand-in model.

The loop is the one a real agent runs: send the conversation to the model, run every
`function_call` item it answers through `session.call` (which returns the `function_call_output`
item the Responses API expects next), append both, repeat until the model answers a message.
`ScriptedModel` replays fixed turns so the example runs offline; swap in
`openai.OpenAI().responses.create(model=..., input=conversation, tools=client.tools(env))` to run
it for real (the SDK's `tools(env)` gives Chat Completions definitions; flatten `function` for
the Responses API).

    .venv/bin/python examples/openai_agent_loop.py [--api-url URL] [--env my-env]
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from atefleet.client import Client

#: What the stand-in model answers, turn by turn: tool calls, then a final message.
SCRIPT: list[list[dict[str, Any]]] = [
    [{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "write_file",
      "arguments": json.dumps({"path": "hello.py", "content": "print('hello from the sandbox')\n"})}],
    [{"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "bash",
      "arguments": json.dumps({"command": "python3 hello.py || echo no python"})}],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}],
]


class ScriptedModel:
    """Answers the next scripted turn whatever the input (a real model reads the input)."""

    def __init__(self, turns: list[list[dict[str, Any]]]) -> None:
        self.turns = iter(turns)

    def respond(self, conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return next(self.turns)


def run(api_url: str | None, env: str, model: ScriptedModel) -> list[dict[str, Any]]:
    """The whole conversation once the model stops calling tools."""
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "Write and run hello.py"}]
    with Client(api_url) as client:
        session = client.session(env, f"agent-{uuid.uuid4().hex[:8]}", auto_resume=True)
        while True:
            output = model.respond(conversation)
            conversation += output
            calls = [item for item in output if item["type"] == "function_call"]
            if not calls:
                session.destroy()
                return conversation
            conversation += [session.call(item) for item in calls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-url", default=None)
    parser.add_argument("--env", default="my-env")
    args = parser.parse_args()
    for item in run(args.api_url, args.env, ScriptedModel(SCRIPT)):
        print(json.dumps(item))


if __name__ == "__main__":
    main()
