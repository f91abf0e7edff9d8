"""Agent Skills: find, parse and validate `SKILL.md` files under a skills directory.

A skill is a subdirectory holding `SKILL.md`: YAML frontmatter between `---` lines, then the
markdown body. Frontmatter fields: `name` (1-64 lowercase letters, digits and hyphens, no
leading, trailing or doubled hyphen, equal to the directory name), `description` (1-1024
characters), optional `license`, `compatibility` (≤ 500 characters), `metadata` (string map)
and `allowed-tools`. A skill breaking these rules is reported as invalid, never fatal.
PyYAML is imported only when a skill is parsed, to keep the guest's start fast.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

SKILL_FILE = "SKILL.md"

NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
NAME_MAX = 64
DESCRIPTION_MAX = 1024
COMPATIBILITY_MAX = 500
KNOWN_FIELDS = frozenset({"name", "description", "license", "compatibility", "metadata", "allowed-tools"})

#: Bundled files listed per skill at most.
MAX_BUNDLED_FILES = 1000


class SkillInvalid(Exception):
    """The skill breaks the Agent Skills rules; the message says which."""


@dataclass
class Skill:
    name: str
    description: str
    directory: str
    body: str
    fields: dict[str, Any] = field(default_factory=dict)


def split_frontmatter(text: str) -> tuple[str, str]:
    """(frontmatter YAML, body) of a SKILL.md."""
    lines = text.lstrip("\ufeff").split("\n")
    if not lines or lines[0].strip() != "---":
        raise SkillInvalid("SKILL.md must start with YAML frontmatter between '---' lines")
    for i, line in enumerate(lines[1:], 1):
        if line.strip() == "---":
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1 :]).strip("\n")
    raise SkillInvalid("SKILL.md frontmatter is not closed by a '---' line")


def _validate(meta: Any, dirname: str) -> None:
    if not isinstance(meta, dict):
        raise SkillInvalid("frontmatter must be a YAML mapping")
    unknown = sorted(set(meta) - KNOWN_FIELDS)
    if unknown:
        raise SkillInvalid(f"unknown frontmatter fields {unknown}")
    name, description = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_MAX or not NAME_RE.match(name):
        raise SkillInvalid("name must be 1-64 lowercase letters, digits and single hyphens (not at the ends)")
    if name != dirname:
        raise SkillInvalid(f"name {name!r} must equal its directory name {dirname!r}")
    if not isinstance(description, str) or not 1 <= len(description.strip()) <= DESCRIPTION_MAX:
        raise SkillInvalid("description must be 1-1024 characters")
    compat = meta.get("compatibility")
    if compat is not None and (not isinstance(compat, str) or len(compat) > COMPATIBILITY_MAX):
        raise SkillInvalid("compatibility must be a string of at most 500 characters")
    metadata = meta.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise SkillInvalid("metadata must be a mapping")


def load_skill(skills_dir: str, dirname: str) -> Skill:
    directory = os.path.join(skills_dir, dirname)
    try:
        with open(os.path.join(directory, SKILL_FILE), encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise SkillInvalid(f"cannot read {SKILL_FILE}: {err.__class__.__name__}") from err
    front, body = split_frontmatter(text)
    import yaml  # lazily: only skill calls pay for PyYAML

    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError as err:
        raise SkillInvalid(f"frontmatter is not valid YAML: {err}") from err
    _validate(meta, dirname)
    return Skill(meta["name"], meta["description"].strip(), directory, body, meta)


def scan(skills_dir: str) -> tuple[list[Skill], list[tuple[str, str]]]:
    """Valid skills and (directory, reason) of invalid ones, sorted by name."""
    try:
        names = sorted(e.name for e in os.scandir(skills_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return [], []
    valid: list[Skill] = []
    invalid: list[tuple[str, str]] = []
    for name in names:
        if not os.path.exists(os.path.join(skills_dir, name, SKILL_FILE)):
            continue
        try:
            valid.append(load_skill(skills_dir, name))
        except SkillInvalid as err:
            invalid.append((name, str(err)))
    return valid, invalid


def bundled_files(skill: Skill) -> list[str]:
    """Absolute paths of the skill's files other than SKILL.md (what the instructions may reference)."""
    found: list[str] = []
    for root, dirs, files in os.walk(skill.directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(root, name)
            if path != os.path.join(skill.directory, SKILL_FILE) and len(found) < MAX_BUNDLED_FILES:
                found.append(path)
    return found
