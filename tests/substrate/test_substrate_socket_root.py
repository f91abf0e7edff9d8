"""Guest sockets of a state dir too deep for a unix socket address (108 bytes with its NUL): a
user's state_dir may be as deep as they like. Its sockets then live in a private dir under /tmp,
which the local Substrate makes, refuses when someone else made it, and removes at a clean stop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.routing import MAX_UDS_PATH, SOCKET_TAIL_CHARS, guest_socket_root
from local_substrate.layout import Layout
from tests.substrate.conftest import ATESPACE, start_harness, substrate_config

pytestmark = pytest.mark.non_root


def _deep(state_dir: Path) -> Path:
    deep = state_dir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return deep


def test_a_short_state_dir_keeps_its_sockets_inside(state_dir: Path) -> None:
    layout = Layout(state_dir / "local-substrate")
    assert layout.sock_root == (state_dir / "local-substrate" / "sock").resolve()
    assert not layout.sock_root_apart


def test_a_deep_state_dir_gets_a_short_private_socket_root_per_dir(state_dir: Path) -> None:
    deep, other = _deep(state_dir), state_dir / ("f" * 120)
    root = guest_socket_root(deep / "local-substrate")
    assert root.parent == Path(f"/tmp/atefleet-{os.getuid()}")
    assert len(str(root)) + SOCKET_TAIL_CHARS <= MAX_UDS_PATH
    assert root != guest_socket_root(other / "local-substrate")
    # Every process of the fleet derives the same dir, however it spells the state dir.
    assert guest_socket_root(deep / ".." / deep.name / "local-substrate") == root


async def test_a_deep_state_dir_serves_guests_and_cleans_up(state_dir: Path) -> None:
    h = await start_harness(substrate_config(_deep(state_dir)))
    layout = h.server.layout
    try:
        assert layout.sock_root_apart
        assert (os.stat(layout.sock_root).st_mode & 0o777) == 0o700
        assert (os.stat(layout.sock_root.parent).st_mode & 0o777) == 0o700
        await h.actor("deep")
        actor = await h.client.resume_actor(ATESPACE, "deep")
        assert (await h.bash(actor, "echo hi > f && cat f"))["stdout"] == "hi\n"
        await h.client.suspend_actor(ATESPACE, "deep")
        actor = await h.client.resume_actor(ATESPACE, "deep")
        assert (await h.bash(actor, "cat f"))["stdout"] == "hi\n"
    finally:
        await h.close()
    assert not layout.sock_root.exists()


@pytest.mark.parametrize("planted", ["link", "open"])
async def test_a_socket_root_someone_else_planted_is_refused_or_closed(state_dir: Path,
                                                                       planted: str) -> None:
    """Another local user can create names in /tmp first: a link there is refused, and a dir
    left open to others is closed before any socket is bound in it."""
    deep = _deep(state_dir)
    root = guest_socket_root(deep / "local-substrate")
    root.parent.mkdir(mode=0o700, exist_ok=True)
    if planted == "link":
        root.symlink_to(state_dir)
        try:
            with pytest.raises(RuntimeError, match="not a dir of this user"):
                await start_harness(substrate_config(deep))
        finally:
            root.unlink()
        return
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    h = await start_harness(substrate_config(deep))
    try:
        assert (os.stat(root).st_mode & 0o777) == 0o700
    finally:
        await h.close()
