"""Fault injection for tests (config `local_substrate.faults`): added latency and error rates per
RPC name ("*" = every RPC). Killing a slot is `LocalSubstrate.kill_slot` (a test calls it).

Two more reproduce what the real server does (SUBSTRATE_CONTROL.md, "Observed on the real server"):

- `arm(rpc, code)`: the next resume or suspend fails midway, after the actor went RESUMING or
  SUSPENDING, and stays there, answering `code` as atelet's own failures do (DEADLINE_EXCEEDED
  "context deadline exceeded" and INTERNAL "workflow cancelled" as the server's 28 s budget ends).
- `upstream_transit` (config): actors left in transit are answered as upstream answers them: a
  resume of a SUSPENDING actor restores its PREVIOUS snapshot (the failed suspend's files are
  lost) instead of finishing the checkpoint first; a suspend of a RESUMING actor is refused
  (INVALID_ARGUMENT) until a resume succeeds.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque

import grpc

from common.config import FaultConfig
from local_substrate.errors import ControlError

#: What the real server answers with each code when an operation ends midway.
MIDWAY_MESSAGES = {
    "DEADLINE_EXCEEDED": "context deadline exceeded",
    "INTERNAL": "workflow cancelled",
}


class Faults:
    def __init__(self, config: FaultConfig) -> None:
        if config.error_code not in grpc.StatusCode.__members__:
            raise ValueError(
                f"local_substrate.faults.error_code {config.error_code!r} is not a gRPC status code"
            )
        self._config = config
        self._random = random.Random(config.seed)
        self.upstream_transit = config.upstream_transit
        #: RPC name → codes of the next failures midway, one per call.
        self._armed: dict[str, deque[str]] = {}

    def _lookup(self, table: dict[str, float], rpc: str) -> float:
        return table.get(rpc, table.get("*", 0.0))

    async def before(self, rpc: str) -> None:
        """Called at the start of every RPC: sleep and/or fail as configured."""
        latency_ms = self._lookup(self._config.latency_ms, rpc)
        if latency_ms > 0:
            await asyncio.sleep(latency_ms / 1000)
        rate = self._lookup(self._config.error_rate, rpc)
        if rate > 0 and self._random.random() < rate:
            raise ControlError(self._config.error_code, f"injected fault in {rpc}")

    def arm(self, rpc: str, code: str, times: int = 1) -> None:
        """The next `times` ResumeActor / SuspendActor / PauseActor calls fail midway with `code`."""
        if code not in grpc.StatusCode.__members__:
            raise ValueError(f"{code!r} is not a gRPC status code")
        self._armed.setdefault(rpc, deque()).extend([code] * times)

    def midway(self, rpc: str) -> None:
        """Called by an operation once the actor is in transit: raise an armed failure, if any."""
        armed = self._armed.get(rpc)
        if armed:
            code = armed.popleft()
            raise ControlError(code, MIDWAY_MESSAGES.get(code, f"injected failure midway through {rpc}"))
