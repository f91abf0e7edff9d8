"""Fault injection for tests (config `local_substrate.faults`): added latency and error rates per
RPC name ("*" = every RPC). Killing a slot is `LocalSubstrate.kill_slot` (a test calls it)."""

from __future__ import annotations

import asyncio
import random

import grpc

from common.config import FaultConfig
from local_substrate.errors import ControlError


class Faults:
    def __init__(self, config: FaultConfig) -> None:
        if config.error_code not in grpc.StatusCode.__members__:
            raise ValueError(
                f"local_substrate.faults.error_code {config.error_code!r} is not a gRPC status code"
            )
        self._config = config
        self._random = random.Random(config.seed)

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
