"""The SDK, CLI, MCP and examples run against the e2e tests' fleets (tests/e2e/conftest.py)."""

from tests.e2e.conftest import KEY_ALICE, KEY_BOB, RunningFleet, auth_fleet, fleet, short_tmp

__all__ = ["KEY_ALICE", "KEY_BOB", "RunningFleet", "auth_fleet", "fleet", "short_tmp"]
