"""Fixtures: a real guest process over temp dirs and a client bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from guest_harness import GuestProc

from common.guest_client import GuestClient


@pytest.fixture
async def guest(tmp_path: Path) -> AsyncIterator[GuestProc]:
    g = GuestProc(tmp_path)
    await g.start()
    yield g
    g.stop()


@pytest.fixture
async def client(guest: GuestProc) -> AsyncIterator[GuestClient]:
    async with guest.client() as c:
        yield c
