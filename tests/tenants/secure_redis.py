"""A real redis-server with a password, an ACL user or TLS (mutual), for the client tests.

Certificates come from a throwaway CA made here with `cryptography` (EC P-256):
the server's names 127.0.0.1 and localhost, a client certificate for
`tls-auth-clients yes`.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.redis_fixtures import RedisServer

#: A least-privilege ACL for the gateway: its own keys and channels, no dangerous commands.
GATEWAY_ACL = ("on", "~specgw:*", "&specgw:*", "+@all", "-@dangerous")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name = issuer[0].subject if issuer else _name(subject)
    signer = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical)
    return builder.sign(signer, hashes.SHA256())


def _usage(**kwargs: bool) -> x509.KeyUsage:
    flags = dict.fromkeys(
        (
            "digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
            "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only",
        ),
        False,
    )  # fmt: skip
    flags.update(kwargs)
    return x509.KeyUsage(**flags)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert(
        "spec-gateway test CA",
        ca_key,
        None,
        [
            (x509.BasicConstraints(ca=True, path_length=None), True),
            (_usage(key_cert_sign=True, crl_sign=True), True),
        ],
    )
    leaf_usage = (_usage(digital_signature=True), True)
    not_ca = (x509.BasicConstraints(ca=False, path_length=None), True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _cert(
        "redis",
        server_key,
        (ca, ca_key),
        [
            not_ca,
            leaf_usage,
            (x509.SubjectAlternativeName(names), False),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _cert(
        "spec-gateway",
        client_key,
        (ca, ca_key),
        [not_ca, leaf_usage, (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)],
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.crt").write_bytes(ca.public_bytes(pem))
    (directory / "server.crt").write_bytes(server.public_bytes(pem))
    (directory / "client.crt").write_bytes(client.public_bytes(pem))
    return Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=_write_key(server_key, directory / "server.key"),
        client_cert=directory / "client.crt",
        client_key=_write_key(client_key, directory / "client.key"),
    )


class SecureRedis(RedisServer):
    """redis-server with `requirepass`, an ACL user (the default user off) and/or TLS."""

    def __init__(
        self,
        workdir: Path,
        *,
        password: str | None = None,
        user: str | None = None,
        pki: Pki | None = None,
    ) -> None:
        args: list[str] = []
        if user is not None:
            assert password is not None
            args += ["--user", "default", "off", "--user", user, *GATEWAY_ACL, f">{password}"]
        elif password is not None:
            args += ["--requirepass", password]
        self.password, self.user, self.pki = password, user, pki
        super().__init__(workdir, extra_args=args)
        if pki is not None:
            self.extra_args += (
                "--port", "0", "--tls-port", str(self.port),
                "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
                "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
            )  # fmt: skip

    @property
    def url(self) -> str:
        scheme = "rediss" if self.pki is not None else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """An admin-side client with the right credentials (start()'s ping uses it)."""
        tls: dict[str, Any] = {}
        if self.pki is not None:
            tls = {
                "ssl": True,
                "ssl_ca_certs": str(self.pki.ca),
                "ssl_certfile": str(self.pki.client_cert),
                "ssl_keyfile": str(self.pki.client_key),
            }
        return redis.Redis(
            port=self.port,
            username=self.user,
            password=self.password,
            socket_timeout=5,
            decode_responses=True,
            **tls,
        )
