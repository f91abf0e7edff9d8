"""list_skills and activate_skill: progressive disclosure of the environment's Agent Skills.

list_skills gives names and descriptions only (plus the invalid skills and why); activate_skill
gives one skill's instructions (the SKILL.md body) and the paths of its bundled files.
"""

from __future__ import annotations

import os
from typing import Any

from guest import skills
from guest.tools.base import Result, ToolContext, ToolError, arg_str


def list_skills(ctx: ToolContext, args: dict[str, Any]) -> Result:
    valid, invalid = skills.scan(ctx.skills_dir)
    lines = [f"- {s.name}: {s.description}" for s in valid] or ["No skills available."]
    if invalid:
        lines.append("\nInvalid skills (not available):")
        lines += [f"- {d}: {reason}" for d, reason in invalid]
    return {
        "output": "\n".join(lines),
        "skills": [{"name": s.name, "description": s.description} for s in valid],
        "invalid": [{"directory": d, "error": reason} for d, reason in invalid],
    }


def activate_skill(ctx: ToolContext, args: dict[str, Any]) -> Result:
    name = arg_str(args, "name", required=True)
    # The name becomes a path component: only well-formed names can reach the filesystem.
    if not skills.NAME_RE.match(name) or len(name) > skills.NAME_MAX:
        raise ToolError(f"'name' {name!r} is not a valid skill name")
    if not os.path.isfile(os.path.join(ctx.skills_dir, name, skills.SKILL_FILE)):
        raise ToolError(f"no skill named {name!r}; list_skills shows the available ones")
    try:
        skill = skills.load_skill(ctx.skills_dir, name)
    except skills.SkillInvalid as err:
        raise ToolError(f"skill {name!r} is not available: {err}") from err
    files = skills.bundled_files(skill)
    text = skill.body
    if files:
        text += "\n\nBundled files:\n" + "\n".join(files)
    return {
        "output": text,
        "name": skill.name,
        "description": skill.description,
        "instructions": skill.body,
        "directory": skill.directory,
        "files": files,
    }
