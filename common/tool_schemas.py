"""JSON schemas of the guest's tools and ready-to-use tool definitions for model APIs.

`TOOL_SCHEMAS[name]` holds a description and the JSON schema of the arguments. `openai_tools`
and `anthropic_tools` render the definitions each API expects, for the tools an environment
allows (the API's /tools endpoint serves them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict


class ToolSchema(TypedDict):
    description: str
    parameters: dict[str, Any]


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


_PATH = {"type": "string", "description": "Path relative to the workspace root (or absolute inside it)."}
_ENCODING = {
    "type": "string",
    "enum": ["utf8", "base64"],
    "default": "utf8",
    "description": "utf8 for text; base64 for binary content.",
}
_MODE = {"type": "string", "pattern": "^[0-7]{3,4}$", "description": 'Octal file mode, e.g. "0644".'}

TOOL_SCHEMAS: dict[str, ToolSchema] = {
    "bash": {
        "description": "Run a shell command with `sh -c` in the workspace. Returns stdout, stderr and "
        "the exit code. Output is bounded (head and tail kept). Use background=true for long-running "
        "servers, then the process tool to read their logs.",
        "parameters": _obj(
            {
                "command": {"type": "string", "description": "The shell command to run."},
                "cwd": {"type": "string", "description": "Working directory, inside the workspace."},
                "env": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "Extra environment variables for this command.",
                },
                "timeout": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Seconds before the whole process group is killed (default 120).",
                },
                "background": {
                    "type": "boolean",
                    "default": False,
                    "description": "Start as a background process and return its process_id at once.",
                },
                "stdin": {"type": "string", "description": "Text written to the command's standard input."},
            },
            ["command"],
        ),
    },
    "read_file": {
        "description": "Read a file from the workspace, whole or a line range or byte window.",
        "parameters": _obj(
            {
                "path": _PATH,
                "encoding": _ENCODING,
                "start_line": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                "end_line": {"type": "integer", "minimum": 1, "description": "Last line (inclusive)."},
                "offset": {"type": "integer", "minimum": 0, "description": "Byte offset to start at."},
                "limit": {"type": "integer", "minimum": 0, "description": "Bytes to read at most."},
            },
            ["path"],
        ),
    },
    "write_file": {
        "description": "Write a file in the workspace atomically, creating parent directories.",
        "parameters": _obj(
            {"path": _PATH, "content": {"type": "string"}, "encoding": _ENCODING, "mode": _MODE},
            ["path", "content"],
        ),
    },
    "list_dir": {
        "description": "List a directory of the workspace (directories end in '/').",
        "parameters": _obj(
            {
                "path": {**_PATH, "default": "."},
                "depth": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 20,
                    "default": 1,
                    "description": "How many levels to descend.",
                },
            }
        ),
    },
    "mkdir": {
        "description": "Create a directory in the workspace (with parents by default).",
        "parameters": _obj(
            {"path": _PATH, "parents": {"type": "boolean", "default": True}, "mode": _MODE}, ["path"]
        ),
    },
    "rm": {
        "description": "Remove a file, symlink or directory (recursive=true for non-empty directories).",
        "parameters": _obj({"path": _PATH, "recursive": {"type": "boolean", "default": False}}, ["path"]),
    },
    "stat": {
        "description": "Type, size, mode and modification time of a workspace path.",
        "parameters": _obj({"path": _PATH}, ["path"]),
    },
    "edit": {
        "description": "Text editor: view a file with line numbers, create a file, replace a unique string, "
        "insert text after a line, or undo the last edit.",
        "parameters": _obj(
            {
                "command": {
                    "type": "string",
                    "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                },
                "path": _PATH,
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                    "description": "[start, end] lines for view; end -1 means to the end.",
                },
                "file_text": {"type": "string", "description": "Content for create."},
                "old_str": {"type": "string", "description": "Exact text to replace (must occur once)."},
                "new_str": {
                    "type": "string",
                    "description": "Replacement (str_replace) or text to insert (insert).",
                },
                "insert_line": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Insert after this line (0 = top).",
                },
                "insert_text": {"type": "string", "description": "Alias of new_str for insert."},
            },
            ["command", "path"],
        ),
    },
    "list_skills": {
        "description": "List the available skills: names and short descriptions.",
        "parameters": _obj({}),
    },
    "activate_skill": {
        "description": "Load a skill's full instructions and the paths of its bundled files.",
        "parameters": _obj(
            {"name": {"type": "string", "description": "The skill's name from list_skills."}}, ["name"]
        ),
    },
    "process": {
        "description": "Manage background processes: status, logs (by byte offsets, optional wait), signal, "
        "kill, list, write_stdin.",
        "parameters": _obj(
            {
                "action": {
                    "type": "string",
                    "enum": ["status", "logs", "signal", "kill", "list", "write_stdin"],
                },
                "process_id": {"type": "string"},
                "stdout_offset": {"type": "integer", "minimum": 0, "default": 0},
                "stderr_offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "description": "Bytes per stream per page."},
                "wait": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 5,
                    "description": "Seconds to wait for new output or exit.",
                },
                "signal": {"type": "string", "description": "Signal name for action=signal, e.g. SIGINT."},
                "data": {"type": "string", "description": "Text for write_stdin."},
                "eof": {"type": "boolean", "description": "Close stdin after writing."},
            },
            ["action"],
        ),
    },
}


def _select(names: Iterable[str]) -> list[tuple[str, ToolSchema]]:
    chosen = []
    for name in names:
        if name not in TOOL_SCHEMAS:
            raise KeyError(f"unknown tool {name!r}")
        chosen.append((name, TOOL_SCHEMAS[name]))
    return chosen


def openai_tools(names: Iterable[str]) -> list[dict[str, Any]]:
    """Chat Completions `tools` entries: `{"type": "function", "function": {name, description,
    parameters}}`."""
    return [
        {
            "type": "function",
            "function": {"name": n, "description": s["description"], "parameters": s["parameters"]},
        }
        for n, s in _select(names)
    ]


def anthropic_tools(names: Iterable[str]) -> list[dict[str, Any]]:
    """Messages API `tools` entries: `{name, description, input_schema}`."""
    return [
        {"name": n, "description": s["description"], "input_schema": s["parameters"]}
        for n, s in _select(names)
    ]
