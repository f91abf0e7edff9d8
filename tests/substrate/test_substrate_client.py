"""Client transport: TLS with a private CA and a server-name override, and a JWT bearer re-read
from its file on every call (a real gRPC server that checks the header)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.ateapi import ateapi_pb2 as pb
from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.config import TLSConfig
from common.substrate import SubstrateClient, Unauthenticated

SERVER_NAME = "api.ate-system.svc"


class TokenCheckingControl(pb_grpc.ControlServicer):  # type: ignore[misc]
    """Answers GetAtespace with the bearer token it received (UNAUTHENTICATED without one)."""

    async def GetAtespace(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        auth = dict(context.invocation_metadata() or ()).get("authorization", "")
        if not auth.startswith("Bearer "):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing token")
        return pb.GetAtespaceResponse(atespace=pb.Atespace(name=auth.removeprefix("Bearer ")))


def _cert(tmp_path: Path) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    cert, key = _cert(tmp_path)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(cert)
    server = grpc.aio.server()
    pb_grpc.add_ControlServicer_to_server(TokenCheckingControl(), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    yield f"127.0.0.1:{port}", ca
    await server.stop(0)


async def test_tls_with_server_name_override_and_a_rotating_token(
    tls_server: tuple[str, Path], tmp_path: Path
) -> None:
    address, ca = tls_server
    token = tmp_path / "token"
    token.write_text("first\n")
    tls = TLSConfig(enabled=True, ca_file=str(ca), server_name=SERVER_NAME)
    async with SubstrateClient(address, tls=tls, token_file=str(token)) as client:
        assert await client._call(
            "GetAtespace", pb.GetAtespaceRequest(name="x"), 5
        ) == pb.GetAtespaceResponse(atespace=pb.Atespace(name="first"))
        # when the file rotates, the next call carries the new token
        token.write_text("second")
        assert await client.get_atespace("x") == "second"
        token.unlink()
        with pytest.raises(Unauthenticated):
            await client.get_atespace("x")
    async with SubstrateClient(address, tls=tls) as no_token:
        with pytest.raises(Unauthenticated):
            await no_token.get_atespace("x")
