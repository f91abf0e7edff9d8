"""How a worker reaches the guest of a RUNNING actor, behind one interface.

- local (embedded local_substrate): the guest listens on a unix socket the local Substrate binds
  outside the sandbox, one per incarnation: `<socket root>/<slot>/<pod_uid prefix>.sock`, from the
  actor's `pod_name` and `pod_uid` in a fresh RUNNING answer. An address remembered from an earlier
  resume names a socket that no longer exists, so it can never reach the slot's next actor.
- cluster: every actor is reached through the atenet router, which picks the actor by the Host
  header `<actor>.<atespace>.actors.resources.substrate.ate.dev`.

Either way every request names the actor it is for (`X-Atefleet-Actor`), and a guest refuses
any actor but the one its launcher gave it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Protocol

from common.config import Config
from common.guest_protocol import GuestAddress
from common.substrate import Actor, ActorNotRunning, ActorStatus, ConfigurationError

#: Host suffix the atenet router selects actors by.
ACTOR_HOST_SUFFIX = "actors.resources.substrate.ate.dev"
#: Longest path a unix socket address can hold (sun_path minus the NUL).
MAX_UDS_PATH = 107


def local_substrate_dir(config: Config) -> Path:
    """The embedded local Substrate's state directory."""
    return Path(config.state_dir).resolve() / "local-substrate"


#: Hex digits of an incarnation's `pod_uid` in its socket's name (short: sun_path is 107 bytes).
SOCKET_UID_CHARS = 12
#: What follows the socket root in the longest guest socket path: `/<slot>/<uid>.sock`.
SOCKET_TAIL_CHARS = len("/slot-99999/") + SOCKET_UID_CHARS + len(".sock")
#: Parent of the socket roots of state dirs too deep for sun_path. Not $TMPDIR: every process of
#: the fleet must derive the same path, and /tmp is sticky, so no other user can swap ours out.
SHORT_SOCKET_PARENT = Path("/tmp")


def guest_socket_root(root: Path) -> Path:
    """The dir of the guest sockets of the local Substrate whose state dir is `root`.

    `<root>/sock` when its sockets' paths fit a unix socket address; otherwise a private dir named
    after `root` under /tmp (`server.py` creates it and checks its owner), so a state dir may be
    as deep as its user likes."""
    root = root.resolve()
    near = root / "sock"
    if len(str(near)) + SOCKET_TAIL_CHARS <= MAX_UDS_PATH:
        return near
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    return SHORT_SOCKET_PARENT / f"atefleet-{os.getuid()}" / digest


def local_guest_socket(sock_root: Path, slot: str, pod_uid: str) -> Path:
    """The guest socket of incarnation `pod_uid` in `slot`, under a `guest_socket_root`."""
    return sock_root / slot / f"{pod_uid[:SOCKET_UID_CHARS]}.sock"


class GuestRouter(Protocol):
    async def address(self, actor: Actor) -> GuestAddress:
        """Where the guest of this freshly fetched RUNNING actor listens."""
        ...


def _require_running(actor: Actor) -> None:
    if actor.status is not ActorStatus.RUNNING:
        raise ActorNotRunning(f"actor {actor.atespace}/{actor.name} is {actor.status.value}, not running")


class LocalGuestRouter:
    """Guests of the embedded local Substrate: one unix socket per slot."""

    def __init__(self, config: Config) -> None:
        self._sock_root = guest_socket_root(local_substrate_dir(config))

    async def address(self, actor: Actor) -> GuestAddress:
        _require_running(actor)
        if not actor.pod_name or not actor.pod_uid:
            raise ActorNotRunning(f"actor {actor.atespace}/{actor.name} has no slot")
        return GuestAddress(uds=str(local_guest_socket(self._sock_root, actor.pod_name, actor.pod_uid)))


class ClusterGuestRouter:
    """Guests behind Substrate's atenet router, selected by Host header."""

    def __init__(self, router_url: str) -> None:
        self._base_url = router_url.rstrip("/")

    async def address(self, actor: Actor) -> GuestAddress:
        _require_running(actor)
        host = f"{actor.name}.{actor.atespace}.{ACTOR_HOST_SUFFIX}"
        return GuestAddress(base_url=self._base_url, headers={"Host": host})


def make_router(config: Config) -> GuestRouter:
    """The local router when Substrate is embedded (`ate.ateapi` empty), else the cluster one."""
    if not config.ate.ateapi:
        return LocalGuestRouter(config)
    return ClusterGuestRouter(config.ate.router_url)


def substrate_address(config: Config) -> str:
    """The Control API address: `ate.ateapi`, or the embedded local Substrate's from its status file.

    An empty `ate.ateapi` means "the embedded local Substrate" to every role; the supervisor picks
    its port, and the server records it in `status.json` once it serves.
    """
    if config.ate.ateapi:
        return config.ate.ateapi
    status = local_substrate_dir(config) / "status.json"
    try:
        address = json.loads(status.read_text())["address"]
    except (OSError, ValueError, KeyError) as err:
        raise ConfigurationError(
            f"ate.ateapi is empty and no embedded local Substrate is running ({status}: {err})") from err
    return str(address)
