"""The async client of Agent Substrate's `ateapi.Control` gRPC API (a cluster or local_substrate).

Everything gRPC stays in this module: callers get `Actor`/`Worker` dataclasses and the errors
below, translated once from status codes (the causes are chained).

    SubstrateError                    retryable: whether trying again later may succeed
    ├── SubstrateUnavailable          UNAVAILABLE / DEADLINE_EXCEEDED after our retries (retryable)
    ├── SubstrateBusy                 ABORTED after our retries: another operation runs (retryable)
    ├── NoFreeWorkers                 FAILED_PRECONDITION "no free workers available" (retryable)
    ├── NotFound                      NOT_FOUND: unknown actor or atespace
    ├── AlreadyExists                 ALREADY_EXISTS
    ├── NotSuspended                  FAILED_PRECONDITION on delete: suspend the actor first
    ├── ActorNotRunning               the actor is not RUNNING where a running one is needed
    ├── ConfigurationError            other FAILED_PRECONDITION (missing template or atespace),
    │   └── TemplateMismatch          create-if-absent found the actor with another template
    ├── InvalidArgument               INVALID_ARGUMENT (e.g. a name that is not a DNS-1123 label)
    ├── SnapshotFailed                RESOURCE_EXHAUSTED: a suspend's snapshot refused or failed
    ├── WorkspaceOverQuota            RESOURCE_EXHAUSTED on resume: a local Substrate's disk guard
    │                                 stopped the actor (answered once; the actor is SUSPENDED)
    ├── Unauthenticated               UNAUTHENTICATED / PERMISSION_DENIED, or no readable token
    └── SubstrateInternal             INTERNAL and anything unexpected

Calls: one channel per client. ABORTED and UNAVAILABLE are retried with full jitter. Resume,
suspend and pause get a deadline of at least 35 s (`lifecycle_deadline_s`) and run shielded: if
the caller is cancelled the call still completes (a cancelled resume would leave the actor
RESUMING), and `close()` waits for such calls. In JWT mode the bearer token is re-read from
`token_file` on every call because the file rotates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from common.ateapi import ateapi_pb2 as pb
from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.config import Config, TLSConfig

log = logging.getLogger(__name__)

#: Deadline of quick calls (get, create, list, atespaces), seconds.
CALL_DEADLINE_S = 10.0
#: Substrate operations may take ~28 s server-side; never give resume/suspend less than this.
MIN_LIFECYCLE_DEADLINE_S = 35.0
#: Attempts of a call answered ABORTED or UNAVAILABLE before the error reaches the caller.
RETRY_ATTEMPTS = 5
#: Full-jitter backoff: sleep uniform(0, min(cap, base * 2**attempt)) seconds.
RETRY_BASE_S = 0.05
RETRY_CAP_S = 2.0
#: The message Substrate uses for "all workers busy" (FAILED_PRECONDITION).
NO_FREE_WORKERS = "no free workers available"
#: ListActors restarts from the first page at most this many times after an error.
LIST_RESTARTS = 3
#: Trailing metadata of a local Substrate's SuspendActor answer: the special files (FIFOs,
#: sockets, devices) its snapshot left out, as JSON {"count": n, "paths": [...]}. Not part of the
#: Substrate contract: a cluster never sends it.
DROPPED_FILES_KEY = "atefleet-dropped-files"
#: Trailing metadata of a local Substrate's SuspendActor answer: the snapshot's size in bytes (a
#: cluster's API reports none, so its sessions show no size).
SNAPSHOT_BYTES_KEY = "atefleet-snapshot-bytes"
#: Characters of paths that report carries at most (gRPC metadata is small).
DROPPED_REPORT_CHARS = 4000
#: Request metadata of a SuspendActor that is the fleet's own park (pressure, idle, after an
#: `auto_resume` call): a local Substrate may then keep the sandbox frozen without writing a
#: snapshot until one is needed. Any other suspend writes one. A cluster ignores it.
PARK_KEY = "atefleet-park"


class SubstrateError(Exception):
    retryable = False


class SubstrateUnavailable(SubstrateError):
    retryable = True


class SubstrateBusy(SubstrateError):
    retryable = True


class NoFreeWorkers(SubstrateError):
    retryable = True


class NotFound(SubstrateError):
    pass


class AlreadyExists(SubstrateError):
    pass


class NotSuspended(SubstrateError):
    pass


class ActorNotRunning(SubstrateError):
    pass


class ConfigurationError(SubstrateError):
    pass


class TemplateMismatch(ConfigurationError):
    pass


class SnapshotFailed(SubstrateError):
    """RESOURCE_EXHAUSTED on suspend: the snapshot was over a template limit or could not be
    written; the actor is SUSPENDED at its previous snapshot."""


class WorkspaceOverQuota(SubstrateError):
    """RESOURCE_EXHAUSTED on resume (local Substrate): its disk guard stopped the actor, over its
    template's limits while the host's disk was low; it is SUSPENDED at its last snapshot, and
    only this resume is refused."""


class InvalidArgument(SubstrateError):
    pass


class Unauthenticated(SubstrateError):
    pass


class SubstrateInternal(SubstrateError):
    pass


class ActorStatus(StrEnum):
    UNSPECIFIED = "unspecified"
    RESUMING = "resuming"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    PAUSING = "pausing"
    PAUSED = "paused"


_STATUS_FROM_PB = {
    pb.Actor.STATUS_UNSPECIFIED: ActorStatus.UNSPECIFIED,
    pb.Actor.STATUS_RESUMING: ActorStatus.RESUMING,
    pb.Actor.STATUS_RUNNING: ActorStatus.RUNNING,
    pb.Actor.STATUS_SUSPENDING: ActorStatus.SUSPENDING,
    pb.Actor.STATUS_SUSPENDED: ActorStatus.SUSPENDED,
    pb.Actor.STATUS_PAUSING: ActorStatus.PAUSING,
    pb.Actor.STATUS_PAUSED: ActorStatus.PAUSED,
}


@dataclass(frozen=True)
class Actor:
    """An actor as Substrate last reported it. `pod_*` are only meaningful while RUNNING."""

    atespace: str
    name: str
    actor_id: str
    version: int
    template_namespace: str
    template_name: str
    status: ActorStatus
    pod_namespace: str = ""
    pod_name: str = ""
    pod_ip: str = ""
    pod_uid: str = ""
    in_progress_snapshot: str = ""
    #: Prefix/URI of the latest snapshot; "" when the actor has none yet.
    latest_snapshot: str = ""
    worker_pool: str = ""
    worker_selector: dict[str, str] = field(default_factory=dict)
    #: Answer to a local Substrate's suspend: special files its snapshot left out (how many, and
    #: the first of their paths).
    dropped_count: int = 0
    dropped_files: tuple[str, ...] = ()
    #: Answer to a local Substrate's suspend: the snapshot's size (None when not reported).
    snapshot_bytes: int | None = None

    @property
    def running(self) -> bool:
        return self.status is ActorStatus.RUNNING


@dataclass(frozen=True)
class Worker:
    namespace: str
    pool: str
    pod: str
    pod_uid: str
    node_name: str
    ip: str
    version: int
    #: The actor it serves; all "" when the worker is free.
    actor_id: str
    actor_atespace: str
    actor_template: str


def _snapshot_prefix(info: Any) -> str:
    which = info.WhichOneof("data")
    if which == "external":
        return str(info.external.snapshot_uri_prefix)
    if which == "local":
        return str(info.local.snapshot_prefix)
    return ""


def _actor_from_pb(atespace: str, name: str, a: Any) -> Actor:
    return Actor(
        atespace=a.atespace or atespace,
        name=name,
        actor_id=a.actor_id,
        version=a.version,
        template_namespace=a.actor_template_namespace,
        template_name=a.actor_template_name,
        status=_STATUS_FROM_PB.get(a.status, ActorStatus.UNSPECIFIED),
        pod_namespace=a.ateom_pod_namespace,
        pod_name=a.ateom_pod_name,
        pod_ip=a.ateom_pod_ip,
        pod_uid=a.ateom_pod_uid,
        in_progress_snapshot=a.in_progress_snapshot,
        latest_snapshot=_snapshot_prefix(a.latest_snapshot_info),
        worker_pool=a.worker_pool_name,
        worker_selector=dict(a.worker_selector.match_labels),
    )


def _worker_from_pb(w: Any) -> Worker:
    return Worker(
        namespace=w.worker_namespace,
        pool=w.worker_pool,
        pod=w.worker_pod,
        pod_uid=w.worker_pod_uid,
        node_name=w.node_name,
        ip=w.ip,
        version=w.version,
        actor_id=w.actor_id,
        actor_atespace=w.actor_atespace,
        actor_template=w.actor_template,
    )


_BY_CODE: dict[grpc.StatusCode, type[SubstrateError]] = {
    grpc.StatusCode.UNAVAILABLE: SubstrateUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: SubstrateUnavailable,
    grpc.StatusCode.ABORTED: SubstrateBusy,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
}

_RETRIED = (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE)


def _classify_precondition(rpc: str, details: str) -> type[SubstrateError]:
    if NO_FREE_WORKERS in details:
        return NoFreeWorkers
    if rpc == "DeleteActor" and "not suspended" in details:
        return NotSuspended
    return ConfigurationError


def translate(rpc: str, err: grpc.aio.AioRpcError) -> SubstrateError:
    """The typed error for a failed call (the one place gRPC codes are interpreted)."""
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        cls = _classify_precondition(rpc, details)
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and rpc in ("SuspendActor", "PauseActor"):
        cls = SnapshotFailed
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and rpc == "ResumeActor":
        cls = WorkspaceOverQuota
    else:
        cls = _BY_CODE.get(code, SubstrateInternal)
    return cls(f"{rpc}: {code.name}: {details}")


def encode_dropped(paths: tuple[str, ...]) -> str:
    """The DROPPED_FILES_KEY value: printable ASCII, names shown with their odd bytes escaped."""
    sample: list[str] = []
    size = 0
    for p in paths:
        shown = os.fsencode(p).decode("utf-8", "backslashreplace")
        size += len(json.dumps(shown))
        if size > DROPPED_REPORT_CHARS:
            break
        sample.append(shown)
    return json.dumps({"count": len(paths), "paths": sample})


def _suspend_report(trailers: dict[str, str]) -> dict[str, Any]:
    """Actor fields from a local Substrate's suspend trailers (each absent when not sent or
    unreadable)."""
    fields: dict[str, Any] = {}
    try:
        report = json.loads(trailers[DROPPED_FILES_KEY])
        fields.update(dropped_count=int(report["count"]), dropped_files=tuple(map(str, report["paths"])))
    except (KeyError, ValueError, TypeError):
        pass
    size = trailers.get(SNAPSHOT_BYTES_KEY, "")
    if size.isdigit():
        fields["snapshot_bytes"] = int(size)
    return fields


def _backoff_s(attempt: int) -> float:
    return random.uniform(0, min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt))


def _read_token(token_file: str) -> str:
    try:
        token = Path(token_file).read_text().strip()
    except OSError as err:
        raise Unauthenticated(f"cannot read the Substrate token file {token_file}: {err}") from err
    if not token:
        raise Unauthenticated(f"the Substrate token file {token_file} is empty")
    return token


def _open_channel(address: str, tls: TLSConfig | None) -> grpc.aio.Channel:
    options: list[tuple[str, Any]] = []
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=options)
    ca = Path(tls.ca_file).read_bytes() if tls.ca_file else None
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.aio.secure_channel(address, creds, options=options)


class SubstrateClient:
    """One connection to a Control API; see the module docstring for the calling rules."""

    def __init__(
        self,
        address: str,
        *,
        tls: TLSConfig | None = None,
        token_file: str = "",
        lifecycle_deadline_s: float = 40.0,
        call_deadline_s: float = CALL_DEADLINE_S,
        retry_attempts: int = RETRY_ATTEMPTS,
    ) -> None:
        self.address = address
        self._channel = _open_channel(address, tls)
        self._stub = pb_grpc.ControlStub(self._channel)  # type: ignore[no-untyped-call]
        self._identity_stub = pb_grpc.SessionIdentityStub(self._channel)  # type: ignore[no-untyped-call]
        self._token_file = token_file
        self._lifecycle_deadline_s = max(lifecycle_deadline_s, MIN_LIFECYCLE_DEADLINE_S)
        self._call_deadline_s = call_deadline_s
        self._retry_attempts = retry_attempts
        #: Shielded lifecycle calls still running; close() waits for them.
        self._inflight: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> SubstrateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace_s: float | None = None) -> None:
        """Wait for shielded lifecycle calls (up to their deadline), then close the channel."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=grace_s or self._lifecycle_deadline_s)
        await self._channel.close()

    def _metadata(self, extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
        if not self._token_file:
            return extra
        return (("authorization", f"Bearer {_read_token(self._token_file)}"), *extra)

    async def _call(
        self, rpc: str, request: Any, deadline_s: float, trailers: dict[str, str] | None = None,
        stub: Any = None, metadata: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        """One RPC (of `Control`, unless `stub` says) with retries on ABORTED/UNAVAILABLE; failures
        become SubstrateErrors. `trailers` receives the answer's trailing metadata."""
        method: Callable[..., Any] = getattr(stub or self._stub, rpc)
        for attempt in range(self._retry_attempts):
            try:
                call = method(request, timeout=deadline_s, metadata=self._metadata(metadata))
                response = await call
                if trailers is not None:
                    received = await call.trailing_metadata() or ()
                    trailers.update((k, v) for k, v in received if isinstance(v, str))
                return response
            except grpc.aio.AioRpcError as err:
                if err.code() not in _RETRIED or attempt == self._retry_attempts - 1:
                    raise translate(rpc, err) from err
            await asyncio.sleep(_backoff_s(attempt))
        raise AssertionError("unreachable: the last attempt raises")

    async def _lifecycle(
        self, rpc: str, request: Any, trailers: dict[str, str] | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> Any:
        """A resume/suspend/pause: long deadline, shielded from the caller's cancellation."""
        task = asyncio.create_task(
            self._call(rpc, request, self._lifecycle_deadline_s, trailers, metadata=metadata)
        )
        self._inflight.add(task)
        task.add_done_callback(self._lifecycle_done)
        return await asyncio.shield(task)

    def _lifecycle_done(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        # If the caller was cancelled nobody awaits the outcome: retrieve it so a failure is
        # logged once here instead of as "exception never retrieved".
        if not task.cancelled() and task.exception() is not None:
            log.info("a lifecycle call finished after its caller left: %s", task.exception())

    # -- session identity -------------------------------------------------------------------------

    async def mint_session_jwt(self, audience: list[str], app_id: str, user_id: str, session_id: str) -> str:
        """`SessionIdentity.MintJWT`: a JWT proving which session speaks, signed by Substrate."""
        request = pb.MintJWTRequest(audience=audience, app_id=app_id, user_id=user_id, session_id=session_id)
        resp = await self._call("MintJWT", request, self._call_deadline_s, stub=self._identity_stub)
        return str(resp.session_jwt)

    # -- actors ---------------------------------------------------------------------------------

    async def get_actor(self, atespace: str, name: str) -> Actor:
        resp = await self._call(
            "GetActor", pb.GetActorRequest(actor_ref=_ref(atespace, name)), self._call_deadline_s
        )
        return _actor_from_pb(atespace, name, resp.actor)

    async def create_actor(
        self, atespace: str, name: str, template: str, template_namespace: str = ""
    ) -> Actor:
        """Create a SUSPENDED actor without a snapshot; AlreadyExists if the name is taken.

        `template_namespace` defaults to the atespace (where a cluster keeps its ActorTemplates).
        """
        req = pb.CreateActorRequest(
            actor_ref=_ref(atespace, name),
            actor_template_namespace=template_namespace or atespace,
            actor_template_name=template,
        )
        resp = await self._call("CreateActor", req, self._call_deadline_s)
        return _actor_from_pb(atespace, name, resp.actor)

    async def ensure_actor(self, atespace: str, name: str, template: str) -> Actor:
        """Create-if-absent: on ALREADY_EXISTS fetch the actor and check it has our template."""
        try:
            return await self.create_actor(atespace, name, template)
        except AlreadyExists:
            actor = await self.get_actor(atespace, name)
        if actor.template_name != template:
            raise TemplateMismatch(
                f"actor {atespace}/{name} exists with template {actor.template_name!r}, not {template!r}"
            )
        return actor

    async def update_actor(self, atespace: str, name: str, worker_selector: dict[str, str]) -> Actor:
        req = pb.UpdateActorRequest(
            actor_ref=_ref(atespace, name), worker_selector=pb.Selector(match_labels=worker_selector)
        )
        resp = await self._call("UpdateActor", req, self._call_deadline_s)
        return _actor_from_pb(atespace, name, resp.actor)

    async def resume_actor(self, atespace: str, name: str, *, boot: bool = False) -> Actor:
        """Make the actor RUNNING (OK and unchanged if it already is). NoFreeWorkers = capacity."""
        resp = await self._lifecycle(
            "ResumeActor", pb.ResumeActorRequest(actor_ref=_ref(atespace, name), boot=boot)
        )
        return _actor_from_pb(atespace, name, resp.actor)

    async def suspend_actor(self, atespace: str, name: str, park: bool = False) -> Actor:
        """Snapshot and stop the actor (a no-op when SUSPENDED; retries a failed suspend); `park`
        says it is the fleet's own (PARK_KEY). SnapshotFailed: the snapshot was refused or failed,
        the actor is back at its last one."""
        trailers: dict[str, str] = {}
        request = pb.SuspendActorRequest(actor_ref=_ref(atespace, name))
        metadata = ((PARK_KEY, "1"),) if park else ()
        resp = await self._lifecycle("SuspendActor", request, trailers, metadata)
        return replace(_actor_from_pb(atespace, name, resp.actor), **_suspend_report(trailers))

    async def pause_actor(self, atespace: str, name: str) -> Actor:
        resp = await self._lifecycle("PauseActor", pb.PauseActorRequest(actor_ref=_ref(atespace, name)))
        return _actor_from_pb(atespace, name, resp.actor)

    async def delete_actor(self, atespace: str, name: str) -> None:
        """Delete a SUSPENDED actor; NotSuspended otherwise. Never while a resume may be in flight."""
        await self._call(
            "DeleteActor", pb.DeleteActorRequest(actor_ref=_ref(atespace, name)), self._call_deadline_s
        )

    async def list_actors(self, atespace: str = "", page_size: int = 0) -> AsyncIterator[Actor]:
        """Every actor (of one atespace, or all), each once.

        Pages may be empty before the end and may repeat or miss actors, so this loops until the
        token is empty, de-duplicates by (atespace, name), and restarts from the first page after
        a retryable error (already yielded actors are not yielded again).
        """
        seen: set[tuple[str, str]] = set()
        for restart in range(LIST_RESTARTS + 1):
            try:
                async for actor in self._list_pages(atespace, page_size):
                    key = (actor.atespace, actor.name)
                    if key not in seen:
                        seen.add(key)
                        yield actor
                return
            except SubstrateError as err:
                if not err.retryable or restart == LIST_RESTARTS:
                    raise
            await asyncio.sleep(_backoff_s(restart))

    async def _list_pages(self, atespace: str, page_size: int) -> AsyncIterator[Actor]:
        token = ""
        while True:
            req = pb.ListActorsRequest(page_size=page_size, page_token=token, atespace=atespace)
            resp = await self._call("ListActors", req, self._call_deadline_s)
            for a in resp.actors:
                # An Actor message has no name field: its actor_id is the name it was created with.
                yield _actor_from_pb(a.atespace, a.actor_id, a)
            token = resp.next_page_token
            if not token:
                return

    async def list_workers(self) -> list[Worker]:
        resp = await self._call("ListWorkers", pb.ListWorkersRequest(), self._call_deadline_s)
        return [_worker_from_pb(w) for w in resp.workers]

    # -- atespaces ------------------------------------------------------------------------------

    async def create_atespace(self, name: str) -> None:
        await self._call("CreateAtespace", pb.CreateAtespaceRequest(name=name), self._call_deadline_s)

    async def get_atespace(self, name: str) -> str:
        """The atespace's name; NotFound if it does not exist."""
        resp = await self._call("GetAtespace", pb.GetAtespaceRequest(name=name), self._call_deadline_s)
        return str(resp.atespace.name)

    async def ensure_atespace(self, name: str) -> None:
        """Create the atespace unless it exists (AlreadyExists is success)."""
        try:
            await self.get_atespace(name)
        except NotFound:
            try:
                await self.create_atespace(name)
            except AlreadyExists:
                pass

    async def list_atespaces(self) -> list[str]:
        resp = await self._call("ListAtespaces", pb.ListAtespacesRequest(), self._call_deadline_s)
        return [a.name for a in resp.atespaces]

    async def delete_atespace(self, name: str) -> None:
        await self._call("DeleteAtespace", pb.DeleteAtespaceRequest(name=name), self._call_deadline_s)


def _ref(atespace: str, name: str) -> Any:
    return pb.ActorRef(atespace=atespace, name=name)


def make_substrate_client(config: Config, address: str = "") -> SubstrateClient:
    """The client for `config.ate.ateapi`, or for `address` (the embedded local Substrate's, whose
    token is its state dir's `token` file)."""
    from common.routing import local_substrate_dir  # routing imports this module

    ate = config.ate
    target = ate.ateapi or address
    if not target:
        raise ConfigurationError("no Substrate address: ate.ateapi is empty and no local address was given")
    tls = ate.tls if ate.ateapi else None
    token_file = ate.token_file if ate.ateapi else str(local_substrate_dir(config) / "token")
    return SubstrateClient(
        target, tls=tls, token_file=token_file, lifecycle_deadline_s=ate.lifecycle_deadline_s
    )
