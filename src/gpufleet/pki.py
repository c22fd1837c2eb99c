"""gpufleet's small internal certificate authority (the ``cryptography`` package; no
openssl binary): the server's TLS certificate and one client certificate per node.

Shape of the chain, as the kubelet's TLS bootstrap does it: an operator makes a join
token; the agent makes its own key (it never leaves the node), sends a CSR with the
token once, and gets back a certificate whose subject is the node's name, signed by the
cluster CA, valid ``NODE_CERT_DAYS``; from then on the agent authenticates every sync
with that certificate (mTLS), and the server takes the node's identity from it. The
server keeps the serial of every certificate it issued; revoking a node refuses its
serials at once (``gpufleet node revoke NODE``).

Files (``CertificateAuthority.create``/``load``): ``ca.crt`` (0644, what agents and CLI
users pass as ``--ca-file``), ``ca.key`` (0600), and for ``gpufleet ca init`` also
``server.crt`` / ``server.key`` (0600). Keys are ECDSA P-256: fast to make and to verify.

Used by the server, ``gpufleet ca init``, the agent's enrolment and the demo's ``--tls``;
it imports nothing of the server.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_CERT_DAYS = 825
NODE_CERT_DAYS = 365
NODE_OU = "gpufleet-node"
"""The organisational unit of node certificates: a certificate without it (a server's,
or one from another CA purpose) never authenticates a node."""


class PkiError(Exception):
    """A certificate, key or CSR that cannot be used (unreadable, malformed, wrong kind)."""


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _alt_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class Issued:
    certificate: bytes
    serial: str
    """Hex, as ``openssl x509 -serial`` prints it."""
    not_after: float


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, directory: Path, *, name: str = "gpufleet cluster CA") -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write(directory / "ca.key", key_pem(key), 0o600)
        _write(directory / "ca.crt", cert_pem(cert), 0o644)
        return cls(cert, key)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        try:
            cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
            key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise PkiError(f"cannot load the CA in {directory}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise PkiError(f"{directory / 'ca.key'} is not an EC key")
        return cls(cert, key)

    @classmethod
    def load_or_create(cls, directory: Path) -> CertificateAuthority:
        if (directory / "ca.crt").exists():
            return cls.load(directory)
        return cls.create(directory)

    @property
    def pem(self) -> bytes:
        return cert_pem(self.cert)

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int
    ) -> x509.CertificateBuilder:
        now = _now()
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )

    def issue_server(self, names: list[str], directory: Path) -> tuple[Path, Path]:
        """A server certificate for ``names`` (host names and IP addresses); writes
        ``server.crt`` and ``server.key`` into ``directory`` and returns their paths."""
        if not names:
            raise PkiError("a server certificate needs at least one name")
        key = new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        cert = (
            self._builder(subject, key.public_key(), SERVER_CERT_DAYS)
            .add_extension(x509.SubjectAlternativeName([_alt_name(n) for n in names]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        crt, kf = directory / "server.crt", directory / "server.key"
        _write(kf, key_pem(key), 0o600)
        _write(crt, cert_pem(cert), 0o644)
        return crt, kf

    def sign_node(self, csr_pem: bytes, *, node: str, days: int = NODE_CERT_DAYS) -> Issued:
        """A client certificate for ``node`` from the agent's CSR. Only the CSR's public
        key is used (its subject is the agent's claim; the node's name is the server's
        decision). Raises PkiError for a CSR that is malformed or not self-signed."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise PkiError(f"not a PEM certificate request: {exc}") from None
        if not csr.is_signature_valid:
            raise PkiError("the certificate request's signature does not verify")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise PkiError("node keys must be ECDSA (P-256)")
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, NODE_OU),
                x509.NameAttribute(NameOID.COMMON_NAME, node),
            ]
        )
        cert = (
            self._builder(subject, public_key, days)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return Issued(
            certificate=cert_pem(cert),
            serial=format(cert.serial_number, "X"),
            not_after=cert.not_valid_after_utc.timestamp(),
        )


def node_csr(key: ec.EllipticCurvePrivateKey, node: str) -> bytes:
    """The agent's request for its node certificate."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerIdentity:
    """A verified client certificate: the node it names and its serial."""

    node: str
    serial: str
    not_after: float


def node_identity(der: bytes) -> PeerIdentity | None:
    """The node a client certificate (DER, already verified against the CA by the TLS
    layer) speaks for, or None when it is not a node certificate."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [a.value for a in ous] != [NODE_OU] or len(cns) != 1:
        return None
    return PeerIdentity(
        node=str(cns[0].value),
        serial=format(cert.serial_number, "X"),
        not_after=cert.not_valid_after_utc.timestamp(),
    )


def certificate_node(pem: bytes) -> PeerIdentity | None:
    """``node_identity`` of a PEM certificate on disk (the agent checks what it holds)."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    return node_identity(cert.public_bytes(serialization.Encoding.DER))
