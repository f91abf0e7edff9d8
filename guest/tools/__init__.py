"""The tool table: tool name → `run(ctx, args)`, the result dict or an awaitable of it."""

from __future__ import annotations

from guest.tools import bash, edit, file_stat, list_dir, mkdir, process, read_file, rm, skills, write_file
from guest.tools.base import Tool

TOOLS: dict[str, Tool] = {
    "bash": bash.run,
    "read_file": read_file.run,
    "write_file": write_file.run,
    "list_dir": list_dir.run,
    "mkdir": mkdir.run,
    "rm": rm.run,
    "stat": file_stat.run,
    "edit": edit.run,
    "list_skills": skills.list_skills,
    "activate_skill": skills.activate_skill,
    "process": process.run,
}
