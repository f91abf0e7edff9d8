"""The guest's HTTP transport on both ends: guest/server.py (against the real guest process and an
in-process HttpServer) and common/guest_http.py (against scripted unix-socket servers)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from guest_harness import ACTOR, GuestProc, new_job_id

import guest.server
from common.guest_http import GuestHTTP, ProtocolError
from common.guest_protocol import ACTOR_HEADER
from guest.server import MAX_BODY_BYTES, MAX_HEAD_BYTES, HttpServer, Request

#: Upper bound on any single wait in these tests: a hang guard, not a timing assertion.
GUARD_S = 10.0

Answer = tuple[int, dict[str, str], Any]


def http_request(method: str, target: str, body: Any = None, extra: str = "") -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {target} HTTP/1.1\r\nhost: guest\r\n{ACTOR_HEADER}: {ACTOR}\r\n{extra}"
        f"content-length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One content-length framed answer: (status, lower-cased headers, decoded JSON body)."""
    async with asyncio.timeout(GUARD_S):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in head[1:] if line)
        headers = {k.lower(): v for k, v in headers.items()}
        body = await reader.readexactly(int(headers["content-length"]))
    return int(head[0].split(" ")[1]), headers, json.loads(body)


async def read_eof(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(GUARD_S):
        return await reader.read()


# ---- server: the real guest ---------------------------------------------------------------
async def test_many_requests_share_one_keep_alive_connection(guest: GuestProc) -> None:
    # Given one connection to the guest
    assert guest.proc is not None
    reader, writer = await asyncio.open_unix_connection(guest.socket)
    # When it carries many requests one after the other
    for _ in range(50):
        writer.write(http_request("GET", "/readyz"))
        status, headers, body = await read_answer(reader)
        # Then each is answered on it and it stays open
        assert (status, body["pid"]) == (200, guest.proc.pid)
        assert "connection" not in headers
    writer.close()


async def test_pipelined_requests_are_answered_in_order(guest: GuestProc) -> None:
    # Given a slow request (a command that runs a while), then two fast ones, all in one write
    reader, writer = await asyncio.open_unix_connection(guest.socket)
    slow = {"job_id": new_job_id(), "tool": "bash", "arguments": {"command": "sleep 0.3; echo slow"}}
    writer.write(
        http_request("POST", "/v1/executions", {**slow, "wait_s": 5})
        + http_request("GET", "/readyz")
        + http_request("GET", "/no/such/route")
    )
    # Then the answers come in request order, the slow one first
    first, second, third = [await read_answer(reader) for _ in range(3)]
    assert first[0] == 200 and first[2]["stdout"] == "slow\n"
    assert second[0] == 200 and second[2]["ready"] is True
    assert third[0] == 404
    writer.close()


@pytest.mark.parametrize(("request_bytes", "status", "error"), [
    # a body announced over the cap: refused before it arrives
    (f"POST /v1/executions HTTP/1.1\r\nhost: guest\r\ncontent-length: {MAX_BODY_BYTES + 1}\r\n\r\n{{"
     .encode(), 413, "body_too_large"),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
])
async def test_refused_requests_are_answered_and_closed(
    guest: GuestProc, request_bytes: bytes, status: int, error: str
) -> None:
    reader, writer = await asyncio.open_unix_connection(guest.socket)
    writer.write(request_bytes)
    answer_status, headers, body = await read_answer(reader)
    assert (answer_status, headers["connection"], body["error"]) == (status, "close", error)
    assert await read_eof(reader) == b""
    writer.close()


async def test_connection_close_is_honoured(guest: GuestProc) -> None:
    reader, writer = await asyncio.open_unix_connection(guest.socket)
    writer.write(http_request("GET", "/readyz", extra="connection: close\r\n"))
    status, headers, _ = await read_answer(reader)
    assert (status, headers["connection"]) == (200, "close")
    assert await read_eof(reader) == b""
    writer.close()


async def test_client_gone_during_a_long_poll_leaves_the_guest_serving(guest: GuestProc) -> None:
    # Given a running command and a long-poll on it
    job_id = new_job_id()
    reader, writer = await asyncio.open_unix_connection(guest.socket)
    start = {"job_id": job_id, "tool": "bash", "arguments": {"command": "sleep 0.5; echo done"}, "wait_s": 0}
    writer.write(http_request("POST", "/v1/executions", start))
    assert (await read_answer(reader))[2]["state"] == "running"
    writer.write(http_request("GET", f"/v1/executions/{job_id}?wait_s=5"))
    # When the client goes away while the poll waits
    writer.close()
    await writer.wait_closed()
    # Then the guest keeps serving and the command still finishes with its output
    async with guest.client() as client:
        view = await client.poll(job_id, wait_s=5)
        while view["state"] == "running":
            view = await client.poll(job_id, wait_s=5)
    assert (view["state"], view["stdout"]) == ("finished", "done\n")
    assert "Traceback" not in (guest.tmp / "guest.log").read_text()


# ---- server: in process, for what the guest's routes cannot show --------------------------
class Probe:
    """Handler of an in-process HttpServer: /wait blocks until cancelled, /boom raises."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def handle(self, req: Request) -> tuple[int, Any]:
        if req.path == "/boom":
            raise RuntimeError("handler bug")
        if req.path == "/unserialisable":
            return 200, {"not json": object()}
        if req.path == "/wait":
            self.waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return 200, {"query": req.query, "body": req.body.decode(), "session": req.headers.get("x-test")}


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, Probe]]:
    probe = Probe()
    server = HttpServer(probe.handle)
    path = str(tmp_path / "server.sock")
    await server.listen_unix(path)
    yield path, probe
    await server.close()


async def test_request_parts_reach_the_handler(served: tuple[str, Probe]) -> None:
    path, _ = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"POST /echo?a=1&b=two HTTP/1.1\r\nX-Test: yes\r\ncontent-length: 5\r\n\r\nhello")
    status, _, body = await read_answer(reader)
    assert (status, body) == (200, {"query": {"a": "1", "b": "two"}, "body": "hello", "session": "yes"})
    writer.close()


async def test_handler_exception_answers_500_and_keeps_the_connection(served: tuple[str, Probe]) -> None:
    path, _ = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /boom HTTP/1.1\r\n\r\nGET /unserialisable HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
    assert [(await read_answer(reader))[0] for _ in range(3)] == [500, 500, 200]
    writer.close()


async def test_chunked_body_over_the_cap_is_refused(
    served: tuple[str, Probe], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a cap of 10 bytes and a chunked body (no length up front) that grows past it
    monkeypatch.setattr(guest.server, "MAX_BODY_BYTES", 10)
    path, _ = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"POST /echo HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n")
    writer.write(b"8\r\n12345678\r\n8\r\n12345678\r\n")
    # Then it is refused with 413 and the connection closed
    assert (await read_answer(reader))[0] == 413
    assert await read_eof(reader) == b""
    writer.close()


async def test_oversize_head_is_refused(served: tuple[str, Probe]) -> None:
    path, _ = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /echo HTTP/1.1\r\nx-big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    status, headers, _ = await read_answer(reader)
    assert (status, headers["connection"]) == (400, "close")
    writer.close()


async def test_disconnect_cancels_the_waiting_handler(served: tuple[str, Probe]) -> None:
    path, probe = served
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /wait HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(GUARD_S):
        await probe.waiting.wait()
        writer.close()
        await probe.cancelled.wait()
    # And the server still answers others
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
    assert (await read_answer(reader))[0] == 200
    writer.close()


async def test_close_cancels_running_handlers(tmp_path: Path) -> None:
    probe = Probe()
    server = HttpServer(probe.handle)
    path = str(tmp_path / "server.sock")
    await server.listen_unix(path)
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(b"GET /wait HTTP/1.1\r\n\r\n")
    async with asyncio.timeout(GUARD_S):
        await probe.waiting.wait()
        await server.close()
    assert probe.cancelled.is_set()
    assert await read_eof(reader) == b""
    writer.close()


# ---- client: GuestHTTP against scripted servers --------------------------------------------
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Scripted:
    """A unix-socket server that runs `script` for each connection and counts connections."""

    def __init__(self, path: str, script: Script) -> None:
        self.path = path
        self.script = script
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer)
        finally:
            writer.close()


@pytest.fixture
async def scripted(tmp_path: Path) -> AsyncIterator[Callable[[Script], Awaitable[Scripted]]]:
    servers: list[asyncio.Server] = []

    async def start(script: Script) -> Scripted:
        s = Scripted(str(tmp_path / f"scripted{len(servers)}.sock"), script)
        servers.append(await asyncio.start_unix_server(s.serve, path=s.path))
        return s

    yield start
    for server in servers:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head (no body: these tests send none)."""
    return await reader.readuntil(b"\r\n\r\n")


def client_for(server: Scripted) -> GuestHTTP:
    return GuestHTTP("http://guest", server.path, {ACTOR_HEADER: ACTOR}, None, connect_timeout_s=5)


async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request of the connection with a chunked body, split across writes."""
    while True:
        head = await read_request(reader)
        assert f"{ACTOR_HEADER.lower()}: {ACTOR}".encode() in head
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")


async def test_chunked_answer_is_read_and_the_connection_reused(
    scripted: Callable[[Script], Awaitable[Scripted]],
) -> None:
    server = await scripted(chunked)
    http = client_for(server)
    assert await http.request("GET", "/a", timeout_s=GUARD_S) == (200, b"hello world")
    assert await http.request("GET", "/b", params={"x": 1}, timeout_s=GUARD_S) == (200, b"hello world")
    assert server.connections == 1
    await http.aclose()


async def test_answer_with_connection_close_is_not_reused(
    scripted: Callable[[Script], Awaitable[Scripted]],
) -> None:
    async def one_shot(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok")

    server = await scripted(one_shot)
    http = client_for(server)
    for _ in range(2):
        assert await http.request("GET", "/", timeout_s=GUARD_S) == (200, b"ok")
    assert server.connections == 2
    await http.aclose()


async def test_answer_without_length_ends_at_close(scripted: Callable[[Script], Awaitable[Scripted]]) -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\n\r\n{"ok":true}')

    http = client_for(await scripted(until_close))
    assert await http.request("GET", "/", timeout_s=GUARD_S) == (200, b'{"ok":true}')
    await http.aclose()


@pytest.mark.parametrize(("answer", "error"), [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial", ConnectionResetError),  # closed mid-answer
    (b"SPDY/9 what\r\n\r\n", ProtocolError),  # not HTTP/1.1
])
async def test_a_broken_answer_raises(
    scripted: Callable[[Script], Awaitable[Scripted]], answer: bytes, error: type[Exception],
) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)

    http = client_for(await scripted(broken))
    with pytest.raises(error):
        await http.request("GET", "/", timeout_s=GUARD_S)
    await http.aclose()


async def test_timeout_raises_and_the_connection_is_not_reused(
    scripted: Callable[[Script], Awaitable[Scripted]],
) -> None:
    # Given a server that never answers the first request of a connection
    async def silent_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:
            await reader.read()  # until the client gives up and closes
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await reader.read()

    server = await scripted(silent_first)
    http = client_for(server)
    # When the first request times out
    with pytest.raises(TimeoutError):
        await http.request("GET", "/", timeout_s=0.2)
    # Then the next one goes over a new connection (a late answer can't be taken for its own)
    assert await http.request("GET", "/", timeout_s=GUARD_S) == (200, b"ok")
    assert server.connections == 2
    await http.aclose()


async def test_missing_socket_is_an_oserror(tmp_path: Path) -> None:
    http = GuestHTTP("http://guest", str(tmp_path / "absent.sock"), {}, None, connect_timeout_s=5)
    with pytest.raises(OSError):
        await http.request("GET", "/", timeout_s=GUARD_S)


def test_headers_that_would_break_the_head_are_refused() -> None:
    with pytest.raises(ValueError):
        GuestHTTP("http://guest", None, {"x-evil": "a\r\nx-injected: 1"}, None, connect_timeout_s=5)


def tls_contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts over a fresh self-signed certificate for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "guest-test")])
    now = datetime.datetime.now(datetime.UTC)
    loopback = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(loopback, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_pem = tmp_path / "cert.pem"
    key_pem = tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_pem, key_pem)
    return server, ssl.create_default_context(cafile=str(cert_pem))


async def test_https_over_tcp(tmp_path: Path) -> None:
    # Given a TLS server on loopback that answers in chunks
    server_tls, client_tls = tls_contexts(tmp_path)
    server = Scripted("", chunked)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=server_tls)
    port = listener.sockets[0].getsockname()[1]
    # When a client asks twice through https
    http = GuestHTTP(f"https://127.0.0.1:{port}", None, {ACTOR_HEADER: ACTOR}, client_tls, 5)
    # Then both answers arrive over one verified connection
    assert await http.request("GET", "/a", timeout_s=GUARD_S) == (200, b"hello world")
    assert await http.request("GET", "/b", timeout_s=GUARD_S) == (200, b"hello world")
    assert server.connections == 1
    await http.aclose()
    listener.close()
