"""The generated stubs are reproducible; actor names; routing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from common.actor_names import actor_name
from common.config import DNS1123_LABEL, parse_config
from common.routing import ClusterGuestRouter, LocalGuestRouter, guest_socket_root, make_router
from common.substrate import Actor, ActorNotRunning, ActorStatus

STUBS = ("ateapi_pb2.py", "ateapi_pb2.pyi", "ateapi_pb2_grpc.py")


def test_regenerating_the_stubs_gives_identical_files(repo_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run([str(repo_root / "proto" / "generate.sh"), str(tmp_path)], check=True, env=env)
    for name in STUBS:
        fresh = (tmp_path / "common" / "ateapi" / name).read_bytes()
        assert fresh == (repo_root / "common" / "ateapi" / name).read_bytes(), (
            f"{name} is stale: run proto/generate.sh"
        )


@given(st.text(min_size=1, max_size=80), st.text(min_size=1, max_size=300))
def test_actor_names_are_dns1123_labels_and_deterministic(env: str, sid: str) -> None:
    name = actor_name(env, sid)
    assert DNS1123_LABEL.match(name)
    assert name == actor_name(env, sid)


def test_actor_names_are_unique_across_environments() -> None:
    # same slug, different pairs: the hash tells them apart
    names = {actor_name("a-b", "c"), actor_name("a", "b-c"), actor_name("A", "b-c"), actor_name("a", "b_c")}
    assert len(names) == 4
    assert actor_name("default-env", "abc") == "s-default-env-abc-21860731fe41541", "the format is frozen"


def _actor(status: ActorStatus, pod: str = "slot-3") -> Actor:
    return Actor("space", "s-x-1", "s-x-1", 3, "space", "tpl", status, pod_name=pod, pod_uid="0123456789abcd")


async def test_routing_local_and_cluster(tmp_path: Path) -> None:
    local = make_router(parse_config({"state_dir": str(tmp_path)}))
    assert isinstance(local, LocalGuestRouter)
    address = await local.address(_actor(ActorStatus.RUNNING))
    # one socket per incarnation: the pod_uid's first 12 hex digits name it
    sock_root = guest_socket_root(tmp_path / "local-substrate")
    assert address.uds == str(sock_root / "slot-3/0123456789ab.sock")
    cluster = make_router(parse_config({"ate": {"ateapi": "api:443", "router_url": "http://router/"}}))
    assert isinstance(cluster, ClusterGuestRouter)
    address = await cluster.address(_actor(ActorStatus.RUNNING))
    assert address.base_url == "http://router"
    assert address.headers == {"Host": "s-x-1.space.actors.resources.substrate.ate.dev"}
    for router in (local, cluster):
        try:
            await router.address(_actor(ActorStatus.SUSPENDED))
            raise AssertionError("a suspended actor has no guest address")
        except ActorNotRunning:
            pass
