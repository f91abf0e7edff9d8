"""Command policy: each environment's ordered allow/deny rules, checked before a call is enqueued.

Config (`environments[].policy`, validated by common.config, so a bad regex fails the fleet's
start naming `environments.N.policy.rules.M.match`):

    policy:
      default: allow | deny
      rules:
        - {effect: deny, tool: bash, match: {command: 'rm\\s+-rf\\s+/'}}
        - {effect: allow, tool: "*"}

A rule matches a call when its `tool` is the call's tool (or "*") and every argument it lists
matches its regex, searched anywhere in the argument's value (text as given; other JSON values
as compact JSON); a listed argument the call lacks does not match. The first matching rule
decides; none matching, `default` does. A refusal is a `PolicyDenied` (403) naming the rule.

Rules are compiled once per process and indexed by tool, so a call only walks the rules that
can match its tool (bench/policy.py measures a call against 50 rules).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from api.auth import Principal
from api.problems import PolicyDenied
from common.config import KNOWN_TOOLS, Config, PolicyConfig
from common.tool_calls import ToolCall

if TYPE_CHECKING:
    from api.fleet import Fleet


@dataclass(frozen=True, slots=True)
class CompiledRule:
    allow: bool
    #: Where the rule is in the config (`environments.N.policy.rules.M`): what a refusal names.
    location: str
    patterns: tuple[tuple[str, re.Pattern[str]], ...]

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        for name, pattern in self.patterns:
            value = arguments.get(name)
            if value is None:
                return False
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            if pattern.search(text) is None:
                return False
        return True


class EnvironmentPolicy:
    """One environment's policy, its rules pre-sorted per tool (order kept)."""

    def __init__(self, config: PolicyConfig, location: str) -> None:
        rules = [CompiledRule(r.effect == "allow", f"{location}.rules.{i}",
                              tuple((arg, re.compile(rx)) for arg, rx in r.match.items()))
                 for i, r in enumerate(config.rules)]
        tools = [r.tool for r in config.rules]
        self._by_tool: dict[str, tuple[CompiledRule, ...]] = {
            tool: tuple(rule for rule, t in zip(rules, tools, strict=True) if t in (tool, "*"))
            for tool in KNOWN_TOOLS}
        self._default_allow = config.default == "allow"
        self._default_location = f"{location}.default"

    def decide(self, tool: str, arguments: Mapping[str, Any]) -> CompiledRule | None:
        """The rule that refuses this call, or None when it is allowed."""
        for rule in self._by_tool.get(tool, ()):
            if rule.matches(arguments):
                return None if rule.allow else rule
        if self._default_allow:
            return None
        return CompiledRule(False, self._default_location, ())

    @property
    def empty(self) -> bool:
        return self._default_allow and not any(self._by_tool.values())


class Policies:
    """Every environment's policy, compiled at start."""

    def __init__(self, config: Config) -> None:
        self._envs = {env.name: EnvironmentPolicy(env.policy, f"environments.{i}.policy")
                      for i, env in enumerate(config.environments)}

    def refusal(self, environment: str, tool: str, arguments: Mapping[str, Any]) -> PolicyDenied | None:
        """The problem refusing this call, or None when the environment's policy allows it."""
        policy = self._envs.get(environment)
        if policy is None or policy.empty:
            return None
        rule = policy.decide(tool, arguments)
        if rule is None:
            return None
        return PolicyDenied(f"the command policy of environment {environment!r} refuses this "
                            f"{tool} call ({rule.location})", rule=rule.location,
                            environment=environment, tool=tool)


async def check_call(fleet: Fleet, principal: Principal, env: str, sid: str, call: ToolCall) -> None:
    """Raise PolicyDenied (403, audited) when the environment's policy refuses the call."""
    refusal = fleet.policies.refusal(env, call.name, call.arguments)
    if refusal is not None:
        await fleet.audit.record("policy_denied", principal.id, env=env, sid=sid, op=call.name,
                                 why=refusal.extensions["rule"])
        raise refusal
