"""The embedded local Substrate: wiring (state dir, sandbox level, control, gRPC) and its lifetime.

`LocalSubstrate(config, listen)` → `await start()` → `address` → `await stop()`; or
`async with running_local_substrate(config) as ls:` (tests and the supervisor's in-process use).
Once serving it writes `status.json` = {"address", "sandbox", "slots", "pid"} atomically.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

import grpc.aio

from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.config import Config
from common.routing import MAX_UDS_PATH, local_substrate_dir
from local_substrate.control import Control
from local_substrate.layout import Layout
from local_substrate.sandbox import compile_code, detect_level
from local_substrate.servicer import ControlServicer

log = logging.getLogger(__name__)

#: Seconds in-flight RPCs get to finish when the server stops.
STOP_GRACE_S = 5.0


def write_json_atomic(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _lock_state_dir(root: Path) -> TextIO:
    """Hold an exclusive lock on the state dir while serving: two servers on one state dir would
    hand the same slots and snapshots out twice. The kernel drops it if the process dies."""
    handle = open(root / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(f"another local substrate is serving from {root}") from None
    return handle


class LocalSubstrate:
    def __init__(self, config: Config, listen: str | None = None, root: Path | None = None) -> None:
        self.config = config
        self.listen = listen or config.local_substrate.listen
        self.layout = Layout(root or local_substrate_dir(config))
        self.address = ""
        self.level = ""
        self.control: Control | None = None
        self._server: grpc.aio.Server | None = None
        self.running = False
        self._lock: TextIO | None = None

    async def start(self) -> None:
        longest = self.layout.socket(f"slot-{self.config.local_substrate.slots - 1}")
        if len(str(longest)) > MAX_UDS_PATH:
            raise RuntimeError(f"state_dir too deep: guest socket {longest} exceeds {MAX_UDS_PATH} bytes")
        self.layout.create()
        self._lock = _lock_state_dir(self.layout.root)
        try:
            await self._serve()
        except BaseException:
            self._lock.close()
            self._lock = None
            raise
        status = {"address": self.address, "sandbox": self.level, "slots": self.config.local_substrate.slots,
                  "pid": os.getpid()}  # fmt: skip
        write_json_atomic(self.layout.status, status)
        self.running = True
        log.info("local substrate serving on %s (sandbox: %s, %d slots)", self.address, self.level,
                 self.config.local_substrate.slots)  # fmt: skip

    async def _serve(self) -> None:
        self.level = await asyncio.to_thread(detect_level, self.config.local_substrate.sandbox)
        await asyncio.to_thread(compile_code)
        self.control = Control(self.config, self.layout, self.level)
        self.control.recover()
        self._server = grpc.aio.server()
        servicer = ControlServicer(self.control, self.control.faults)
        pb_grpc.add_ControlServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        port = self._server.add_insecure_port(self.listen)
        await self._server.start()
        self.address = f"{host}:{port}"

    async def stop(self, suspend_running: bool = True) -> None:
        """Stop taking calls, then snapshot running actors (unless told not to) and stop guests."""
        if not self.running:
            return
        self.running = False
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
        if self.control is not None:
            await self.control.close(suspend_running=suspend_running)
        self.layout.status.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    async def kill_slot(self, slot: str) -> None:
        """Fault injection: kill a slot's sandbox as if its worker pod died."""
        if self.control is None:
            raise RuntimeError("not started")
        await self.control.kill_slot(slot)


@asynccontextmanager
async def running_local_substrate(
    config: Config, listen: str = "127.0.0.1:0", suspend_on_exit: bool = True
) -> AsyncIterator[LocalSubstrate]:
    """A started local Substrate for the block; `.address` is its gRPC address."""
    server = LocalSubstrate(config, listen)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(suspend_running=suspend_on_exit)
