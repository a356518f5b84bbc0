"""The run's TLS material: one fresh key and self-signed certificate per run, made by the console.

Every party of the run's TCP links (the console's Slurm port, the dials, a detached run's
coordinator and followers) presents this certificate and accepts only a peer that presents it
(``agent/tls.py``). It reaches the nodes only over a channel that is already trusted: the srun
step's environment (never a command line) or the Detach message on SSH stdin. ECDSA P-256: every
OpenSSL a node may have (1.0.2 on) speaks it; the extensions are those OpenSSL 3's strict
verification asks of a certificate that is its own trust anchor.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from mscon.agent import tls

# As long as a run may live, detached ones included (their links dial back weeks later): ten years.
# Expiry guards nothing here: the key is fresh per run, never reused, and every end pins the exact
# certificate, so a stolen key is the run's secret however long the certificate says.
VALID_FOR = datetime.timedelta(days=3650)
_CLOCK_SKEW = datetime.timedelta(hours=1)  # a node whose clock is behind still accepts it


@dataclass(frozen=True, slots=True)
class RunTls:
    """PEM text of the run's certificate and its private key (the key is a secret: never logged,
    never on a command line)."""

    cert: str
    key: str = ""

    def __repr__(self) -> str:
        return "RunTls(<run certificate>)"

    def server_context(self) -> object:
        return tls.server_context(self.cert, self.key)

    def client_context(self) -> object:
        return tls.client_context(self.cert, self.key)


def make_run_tls(name: str = "mscon run", now: datetime.datetime | None = None) -> RunTls:
    """A fresh key and self-signed certificate for one run, valid from ``now`` (default: the
    clock's now) for ``VALID_FOR``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or "mscon run")])
    now = now or datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + VALID_FOR)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        # Names are not checked (the peer is pinned), but a certificate without any is refused by
        # some verifiers.
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("mscon-run"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return RunTls(
        cert=cert.public_bytes(serialization.Encoding.PEM).decode("ascii"),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii"),
    )
