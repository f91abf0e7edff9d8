"""`ateapi.Control` over gRPC: turns requests into `Control` calls and errors into status codes."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from common.ateapi import ateapi_pb2 as pb
from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.substrate import DROPPED_FILES_KEY, PARK_KEY, SNAPSHOT_BYTES_KEY, encode_dropped
from local_substrate.control import Control
from local_substrate.errors import VERSION_CONFLICT, ControlError
from local_substrate.faults import Faults
from local_substrate.store import ActorRecord, Status, VersionConflict

log = logging.getLogger(__name__)
T = TypeVar("T")

POD_NAMESPACE = "local-substrate"
WORKER_POOL = "local"


def actor_pb(rec: ActorRecord) -> Any:
    snapshot = pb.SnapshotInfo()
    if rec.snapshot:
        snapshot = pb.SnapshotInfo(
            type=pb.SNAPSHOT_TYPE_LOCAL,
            local=pb.LocalSnapshotInfo(snapshot_prefix=rec.snapshot, node_vms_with_local_snapshots=["local"]),
        )
    running = rec.status in (Status.RESUMING, Status.RUNNING, Status.SUSPENDING, Status.PAUSING)
    return pb.Actor(
        # The actor's id is its name: that is how a ListActors answer names its actors.
        actor_id=rec.name,
        version=rec.version,
        actor_template_namespace=rec.template_namespace,
        actor_template_name=rec.template_name,
        status=f"STATUS_{rec.status.name}",
        ateom_pod_namespace=POD_NAMESPACE if running and rec.slot else "",
        ateom_pod_name=rec.slot if running else "",
        ateom_pod_uid=rec.run_id if running else "",
        latest_snapshot_info=snapshot,
        worker_selector=pb.Selector(match_labels=rec.selector),
        worker_pool_name=WORKER_POOL,
        atespace=rec.atespace,
    )


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, control: Control, faults: Faults) -> None:
        self._c = control
        self._faults = faults
        self._node = socket.gethostname()

    async def _run(
        self, rpc: str, context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            await self._faults.before(rpc)
            return await call()
        except ControlError as err:
            await context.abort(grpc.StatusCode[err.code], err.message)
        except VersionConflict:
            await context.abort(grpc.StatusCode.ABORTED, VERSION_CONFLICT)
        except Exception as err:
            log.exception("%s failed", rpc)
            await context.abort(grpc.StatusCode.INTERNAL, f"{rpc} failed: {err}")
        raise AssertionError("unreachable: abort raises")

    async def GetActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            return pb.GetActorResponse(actor=actor_pb(self._c.get_actor(ref.atespace, ref.name)))

        return await self._run("GetActor", context, call)

    async def CreateActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            rec = self._c.create_actor(
                ref.atespace,
                ref.name,
                request.actor_template_namespace,
                request.actor_template_name,
                dict(request.worker_selector.match_labels),
            )
            return pb.CreateActorResponse(actor=actor_pb(rec))

        return await self._run("CreateActor", context, call)

    async def UpdateActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            rec = self._c.update_actor(ref.atespace, ref.name, dict(request.worker_selector.match_labels))
            return pb.UpdateActorResponse(actor=actor_pb(rec))

        return await self._run("UpdateActor", context, call)

    async def ResumeActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            return pb.ResumeActorResponse(
                actor=actor_pb(await self._c.resume(ref.atespace, ref.name, request.boot))
            )

        return await self._run("ResumeActor", context, call)

    async def SuspendActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            park = any(key == PARK_KEY for key, _ in context.invocation_metadata() or ())
            rec = await self._c.suspend(ref.atespace, ref.name, park=park)
            # A park that left the files held wrote no snapshot: no size to report.
            size = None if rec.held else _file_size(rec.snapshot)
            report = [] if size is None else [(SNAPSHOT_BYTES_KEY, str(size))]
            if rec.dropped:
                report.append((DROPPED_FILES_KEY, encode_dropped(rec.dropped)))
            context.set_trailing_metadata(tuple(report))
            return pb.SuspendActorResponse(actor=actor_pb(rec))

        return await self._run("SuspendActor", context, call)

    async def PauseActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            ref = request.actor_ref
            return pb.PauseActorResponse(actor=actor_pb(await self._c.pause(ref.atespace, ref.name)))

        return await self._run("PauseActor", context, call)

    async def DeleteActor(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._c.delete_actor(request.actor_ref.atespace, request.actor_ref.name)
            return pb.DeleteActorResponse()

        return await self._run("DeleteActor", context, call)

    async def ListActors(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            recs, token = self._c.list_actors(request.page_size, request.page_token, request.atespace)
            return pb.ListActorsResponse(actors=[actor_pb(r) for r in recs], next_page_token=token)

        return await self._run("ListActors", context, call)

    async def ListWorkers(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            return pb.ListWorkersResponse(
                workers=[self._worker(s.name, s.uid, r) for s, r in self._c.workers()]
            )

        return await self._run("ListWorkers", context, call)

    def _worker(self, slot: str, uid: int, rec: ActorRecord | None) -> Any:
        w = pb.Worker(
            worker_namespace=POD_NAMESPACE, worker_pool=WORKER_POOL, worker_pod=slot, node_name=self._node
        )
        if rec is not None:
            w.actor_namespace = rec.template_namespace
            w.actor_template = rec.template_name
            w.actor_id = rec.name
            w.version = rec.version
            w.worker_pod_uid = rec.run_id
            w.actor_atespace = rec.atespace
        return w

    async def CreateAtespace(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            return pb.CreateAtespaceResponse(atespace=pb.Atespace(name=self._c.create_atespace(request.name)))

        return await self._run("CreateAtespace", context, call)

    async def GetAtespace(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            return pb.GetAtespaceResponse(atespace=pb.Atespace(name=self._c.get_atespace(request.name)))

        return await self._run("GetAtespace", context, call)

    async def ListAtespaces(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            return pb.ListAtespacesResponse(atespaces=[pb.Atespace(name=n) for n in self._c.list_atespaces()])

        return await self._run("ListAtespaces", context, call)

    async def DeleteAtespace(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._c.delete_atespace(request.name)
            return pb.DeleteAtespaceResponse()

        return await self._run("DeleteAtespace", context, call)

    async def DebugClear(self, request: Any, context: Any) -> Any:
        async def call() -> Any:
            self._c.debug_clear()
            return pb.DebugClearResponse()

        return await self._run("DebugClear", context, call)


def _file_size(path: str) -> int | None:
    """Bytes of a snapshot file (None for none yet, or one pruned meanwhile)."""
    try:
        return os.stat(path).st_size if path else None
    except OSError:
        return None
