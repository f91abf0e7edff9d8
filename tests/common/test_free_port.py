"""free_port: a port the kernel hands out again right after its chooser released it (a test's
API port, say) is skipped when named in `avoid`."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from common import ports
from common.ports import free_port


class _Sockets:
    """socket.socket stand-in whose bind(0) gets the given ports in turn (pure logic)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports

    def __call__(self) -> Any:
        ports = self.ports

        class Sock:
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def bind(self, address: tuple[str, int]) -> None:
                self.port = ports.pop(0)

            def getsockname(self) -> tuple[str, int]:
                return ("127.0.0.1", self.port)

        return Sock()


def test_a_port_to_avoid_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports.socket, "socket", _Sockets([7001, 7001, 7002]))
    assert free_port(avoid={7001}) == 7002


def test_a_real_free_port_binds() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
