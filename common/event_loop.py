"""The event loop of each role.

Roles that only do network I/O (API, workers, reconciler, webhook deliverer) run on uvloop: its
transports and scheduler cost about half of the stdlib loop's CPU per request, and those roles
are CPU-bound under load. Roles that spawn processes (the guest, local Substrate) keep the stdlib
loop, which spawns about twice as fast here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

#: uvicorn's name for the loop the API runs on (same choice as `run_network_role`).
UVICORN_LOOP = "uvloop"


def run_network_role(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh uvloop loop (the `asyncio.run` of network-only roles)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
