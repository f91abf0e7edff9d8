"""HTTPS through the pinned transport: the certificate is checked against the URL's host name, not
the pinned IP, and that name is sent as SNI (a loopback TLS server with a throwaway CA)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from workers.webhook_target import PinnedTransport


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey,
             issuer_key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    """The fields and key identifiers every certificate has. Python 3.13 verifies strictly
    (VERIFY_X509_STRICT): a certificate without an Authority Key Identifier is refused, as is a CA
    without a Subject Key Identifier or keyUsage, so these look like a real CA's."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )


def _key_usage(*, digital_signature: bool, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign, crl_sign=key_cert_sign,
        encipher_only=False, decipher_only=False)


def _ca_cert(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    return (
        _builder("test CA", "test CA", key, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )


def _server_cert(dns: str, key: ec.EllipticCurvePrivateKey,
                 ca_key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    return (
        _builder(dns, "test CA", key, ca_key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class TLSReceiver:
    """A loopback HTTPS server presenting a certificate for `dns`; records SNI and Host."""

    def __init__(self, tmp: Path, dns: str) -> None:
        ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca = _ca_cert(ca_key)
        leaf = _server_cert(dns, leaf_key, ca_key)
        (tmp / "leaf.pem").write_bytes(_pem(leaf) + _pem(leaf_key))
        self.server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server_ctx.load_cert_chain(tmp / "leaf.pem")
        self.server_ctx.sni_callback = self._sni
        self.trust = ssl.create_default_context(cadata=_pem(ca).decode())
        self.sni: list[str | None] = []
        self.hosts: list[str] = []

    def _sni(self, sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        self.sni.append(name)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
            self.hosts += [line[5:].strip() for line in head.split("\r\n") if line.startswith("host:")]
            writer.write(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client refused the certificate and hung up
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serve(receiver: TLSReceiver) -> AsyncIterator[int]:
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0, ssl=receiver.server_ctx)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


@pytest.fixture
async def localhost_tls(tmp_path: Path) -> AsyncIterator[tuple[TLSReceiver, int]]:
    receiver = TLSReceiver(tmp_path, "localhost")
    async with serve(receiver) as port:
        yield receiver, port


async def test_https_checks_the_host_name_and_sends_it_as_sni(localhost_tls: tuple[TLSReceiver, int]) -> None:
    receiver, port = localhost_tls
    transport = PinnedTransport(allow_private=True, idle_close_s=60, trust=receiver.trust)
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.post(f"https://localhost:{port}/hook", content=b"{}")
    assert response.status_code == 204
    assert receiver.sni == ["localhost"]
    assert receiver.hosts == [f"localhost:{port}"]


async def test_a_certificate_for_another_name_is_refused(tmp_path: Path) -> None:
    # Given a server whose certificate names another host, reached by a name resolving to its IP
    receiver = TLSReceiver(tmp_path, "other.example")
    async with serve(receiver) as port:
        transport = PinnedTransport(allow_private=True, idle_close_s=60, trust=receiver.trust)
        async with httpx.AsyncClient(transport=transport) as client:
            # Then the TLS handshake fails: pinning the IP did not turn off the name check
            with pytest.raises(httpx.ConnectError, match="certificate"):
                await client.post(f"https://localhost:{port}/hook", content=b"{}")
        assert receiver.hosts == []
