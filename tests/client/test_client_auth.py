"""The SDK against the auth fleet: bearer tokens, refusals as their problem classes, and a sync
call outlasting the API's sync wait (answered 202) followed to its result."""

from __future__ import annotations

import uuid

import pytest

from atefleet.client import AsyncClient, Client
from atefleet.client.errors import ForbiddenError, NotFoundError, UnauthorizedError
from tests.client.conftest import KEY_ALICE, KEY_BOB, RunningFleet
from tests.e2e.conftest import AUTH_FLEET_SYNC_WAIT_S


def test_token_and_refusals(auth_fleet: RunningFleet, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(auth_fleet.url) as anonymous, pytest.raises(UnauthorizedError) as err:
        anonymous.environments()
    assert err.value.problem.slug == "unauthorized"
    with Client(auth_fleet.url, "ak_wrong_key") as wrong, pytest.raises(UnauthorizedError):
        wrong.environments()
    with Client(auth_fleet.url, KEY_ALICE) as alice:
        assert [e.name for e in alice.environments()] == ["my-env"]
        with pytest.raises((ForbiddenError, NotFoundError)):
            alice.session("other-env", "s1").resume()
    # The token may come from the environment, as for the CLI
    monkeypatch.setenv("ATEFLEET_TOKEN", KEY_BOB)
    with Client(auth_fleet.url) as bob:
        assert "other-env" in {e.name for e in bob.environments()}


def test_a_sync_call_past_the_sync_wait_is_followed(auth_fleet: RunningFleet) -> None:
    with Client(auth_fleet.url, KEY_ALICE) as alice:
        session = alice.session("my-env", f"slow-{uuid.uuid4().hex[:8]}", auto_resume=True)
        result = session.bash(f"sleep {AUTH_FLEET_SYNC_WAIT_S + 1}; echo late")
        assert result.output == "late\n"


async def test_async_client_token(auth_fleet: RunningFleet) -> None:
    async with AsyncClient(auth_fleet.url, KEY_ALICE) as alice:
        assert [e.name for e in await alice.environments()] == ["my-env"]
    async with AsyncClient(auth_fleet.url) as anonymous:
        with pytest.raises(UnauthorizedError):
            await anonymous.environments()
