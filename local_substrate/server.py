"""The embedded local Substrate: wiring (state dir, sandbox level, control, gRPC) and its lifetime.

`LocalSubstrate(config, listen)` → `await start()` → `address` → `await stop()`; or
`async with running_local_substrate(config) as ls:` (tests and the supervisor's in-process use).
Once serving it writes `status.json` = {"address", "sandbox", "slots", "pid", "isolation"}
atomically.

Every call must carry `authorization: Bearer <token>`, the token being the state dir's `token`
file (0600, made at first start): a tenant with `network: host` reaches the port, not the file.
Clients of the embedded server read it there (`common.substrate.make_substrate_client`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc.aio

from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.config import Config
from common.file_lock import try_lock
from common.routing import local_substrate_dir
from local_substrate.control import Control
from local_substrate.disk_guard import DiskGuard
from local_substrate.isolation import isolation_report
from local_substrate.layout import Layout
from local_substrate.sandbox import compile_code, detect_level, nproc_counted_per_sandbox, write_etc
from local_substrate.servicer import ControlServicer
from local_substrate.slots import UidBlock, claim_uid_block

log = logging.getLogger(__name__)

#: Seconds in-flight RPCs get to finish when the server stops.
STOP_GRACE_S = 5.0


def write_json_atomic(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _lock_state_dir(root: Path) -> int:
    """Hold an exclusive lock on the state dir while serving: two servers on one state dir would
    hand the same slots and snapshots out twice."""
    lock = try_lock(root / "lock")
    if lock is None:
        raise RuntimeError(f"another local substrate is serving from {root}")
    return lock


def read_or_make_token(path: Path) -> str:
    """The gRPC credential: made once (0600, only the fleet's user can read it), then reused so
    running clients keep working across restarts. Written whole to a temporary file and linked
    into place, so a crash never leaves an empty token behind."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another start won the race: its token stands
        finally:
            tmp.unlink()
    return path.read_text().strip()


class TokenAuth(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses (UNAUTHENTICATED) every call without `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong local Substrate token")

        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(given).encode(), self._expected):
            return await continuation(details)
        return self._refusal


def check_network_host(config: Config) -> None:
    """`network: host` lets tenant code reach the loopback API, Redis and this port: refused
    unless the API requires auth (it is for trusted templates only; docs/security.md)."""
    host = [t.name for t in config.local_substrate.templates if t.network == "host"]
    if host and not config.auth.enabled:
        raise RuntimeError(
            f"templates {host} use network: host, which exposes the fleet's loopback services to "
            "tenant code; configure auth (auth.api_keys or auth.jwt) first, and use it for trusted "
            "templates only"
        )


class LocalSubstrate:
    def __init__(self, config: Config, listen: str | None = None, root: Path | None = None) -> None:
        self.config = config
        self.listen = listen or config.local_substrate.listen
        self.layout = Layout(root or local_substrate_dir(config))
        self.address = ""
        self.level = ""
        #: The isolation in force (local_substrate.isolation), once started.
        self.isolation: dict[str, Any] = {}
        self.control: Control | None = None
        #: Stops running slots over their template's limits while the disk is low (once started).
        self.disk_guard: DiskGuard | None = None
        self._server: grpc.aio.Server | None = None
        self.running = False
        self._lock: int | None = None
        self._uids: UidBlock | None = None

    async def start(self) -> None:
        check_network_host(self.config)
        self.layout.create()
        self._lock = _lock_state_dir(self.layout.root)
        try:
            await self._serve()
        except BaseException:
            self._unlock()
            raise
        status = {"address": self.address, "sandbox": self.level, "slots": self.config.local_substrate.slots,
                  "pid": os.getpid(), "isolation": self.isolation,
                  "uid_first": self._uids.first if self._uids else None}  # fmt: skip
        write_json_atomic(self.layout.status, status)
        self.running = True
        log.info("local substrate serving on %s (sandbox: %s, %d slots); isolation: %s", self.address,
                 self.level, self.config.local_substrate.slots, json.dumps(self.isolation))  # fmt: skip

    async def _serve(self) -> None:
        self.level = await asyncio.to_thread(detect_level, self.config.local_substrate.sandbox)
        await asyncio.to_thread(compile_code)
        self._uids = uids = claim_uid_block(self.layout.root)
        slot_uids = list(range(uids.first, uids.first + self.config.local_substrate.slots + 1))
        write_etc(self.layout.sandbox_etc, slot_uids if os.geteuid() == 0 else [os.getuid()])
        nproc_own = await asyncio.to_thread(nproc_counted_per_sandbox, self.level)
        self.control = Control(self.config, self.layout, self.level, uids, nproc_own)
        self.isolation = isolation_report(self.config, self.level, self.control.cgroups.mode, nproc_own)
        self.control.recover()
        if self.control.zygote is not None:
            await self.control.zygote.start()
        self._server = grpc.aio.server(interceptors=[TokenAuth(read_or_make_token(self.layout.token))])
        servicer = ControlServicer(self.control, self.control.faults)
        pb_grpc.add_ControlServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]
        host = self.listen.rpartition(":")[0] or "127.0.0.1"
        port = self._server.add_insecure_port(self.listen)
        await self._server.start()
        self.address = f"{host}:{port}"
        cfg = self.config.local_substrate
        self.disk_guard = DiskGuard(
            self.control, self.layout.root, cfg.disk_reserve_mb, cfg.disk_check_period_s
        )
        self.disk_guard.start()

    async def stop(self, suspend_running: bool = True) -> None:
        """Stop taking calls, then snapshot running actors (unless told not to) and stop guests."""
        if not self.running:
            return
        self.running = False
        if self._server is not None:
            await self._server.stop(STOP_GRACE_S)
        # Before the Control closes: a guard stop must not race the final suspends.
        if self.disk_guard is not None:
            await self.disk_guard.stop()
        if self.control is not None:
            await self.control.close(suspend_running=suspend_running)
        self.layout.status.unlink(missing_ok=True)
        self.layout.remove_sockets_apart()
        self._unlock()

    def _unlock(self) -> None:
        if self._uids is not None:
            self._uids.release()
            self._uids = None
        if self._lock is not None:
            os.close(self._lock)
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
