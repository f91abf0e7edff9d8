"""A throwaway CA and the certificates it signs, written as PEM files for servers and clients under test.

Certificates carry the extensions a strict verifier asks for (Python 3.13 sets
VERIFY_X509_STRICT: an Authority Key Identifier on every certificate, a Subject Key Identifier and
keyUsage on the CA), so the same files pass on every interpreter CI runs.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates are valid (a test run is far shorter).
VALID_FOR = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA's certificate, and a server's and a client's certificate and key."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False)


def _signed(subject: str, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
            *extensions: tuple[x509.ExtensionType, bool]) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name("atefleet test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(ca_key, hashes.SHA256())


def _leaf(subject: str, key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
          usage: x509.ObjectIdentifier, names: list[x509.GeneralName]) -> x509.Certificate:
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (_key_usage(ca=False), True),
        (x509.ExtendedKeyUsage([usage]), False),
    ]
    if names:
        extensions.append((x509.SubjectAlternativeName(names), False))
    return _signed(subject, key, ca_key, *extensions)


def _write(path: Path, obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
    if isinstance(obj, x509.Certificate):
        data = obj.public_bytes(serialization.Encoding.PEM)
    else:
        data = obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def make_tls_files(directory: Path, host: str = "localhost") -> TLSFiles:
    """A new CA in `directory`, a server certificate for `host` and 127.0.0.1, and a client one."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _signed("atefleet test CA", ca_key, ca_key,
                 (x509.BasicConstraints(ca=True, path_length=0), True), (_key_usage(ca=True), True))
    server = _leaf(host, server_key, ca_key, ExtendedKeyUsageOID.SERVER_AUTH,
                   [x509.DNSName(host), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client = _leaf("atefleet test client", client_key, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return TLSFiles(
        ca=_write(directory / "ca.pem", ca),
        server_cert=_write(directory / "server.pem", server),
        server_key=_write(directory / "server.key", server_key),
        client_cert=_write(directory / "client.pem", client),
        client_key=_write(directory / "client.key", client_key),
    )
