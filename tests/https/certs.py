"""A test CA and the certificates the HTTPS tests serve, made with ``cryptography``.

Nothing here is trusted by the machine: each test hands the CA to whoever must
trust it (requests via ``verify=``, Chromium via an NSS database, Caddy via
``SSL_CERT_FILE``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = dt.datetime.now(dt.UTC)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def key_pem(key, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass
class CA:
    key: object
    cert: x509.Certificate

    @classmethod
    def make(cls, name: str = "GPU Workbench test CA") -> CA:
        key = _key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def issue(self, *names: str, not_before: dt.datetime | None = None, not_after: dt.datetime | None = None, key=None):
        """(certificate, key) for DNS names and IP addresses, valid from yesterday for 30 days unless told."""
        key = key or _key()
        alt = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(names[0]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or NOW - dt.timedelta(days=1))
            .not_valid_after(not_after or NOW + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert, key

    def write(self, directory: Path, stem: str, *names: str, **kwargs) -> tuple[Path, Path]:
        """Write <stem>.pem (certificate, then the CA) and <stem>-key.pem (mode 0600)."""
        cert, key = self.issue(*names, **kwargs)
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}-key.pem"
        cert_path.write_bytes(cert_pem(cert) + cert_pem(self.cert))
        key_path.write_bytes(key_pem(key))
        key_path.chmod(0o600)
        return cert_path, key_path

    def write_ca(self, path: Path) -> Path:
        path.write_bytes(cert_pem(self.cert))
        return path


def spki_hash(cert: x509.Certificate) -> str:
    """base64(sha256(SubjectPublicKeyInfo)): Chromium's --ignore-certificate-errors-spki-list format."""
    der = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def nss_home(home: Path, ca_pem: Path) -> Path:
    """A HOME whose NSS database (~/.pki/nssdb, which Chromium on Linux reads) trusts ``ca_pem`` for TLS servers.

    Needs certutil (Debian: libnss3-tools). Returns ``home``.
    """
    certutil = shutil.which("certutil")
    if certutil is None:
        raise FileNotFoundError("certutil (apt-get install libnss3-tools)")
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True, exist_ok=True)
    subprocess.run([certutil, "-N", "-d", f"sql:{db}", "--empty-password"], check=True, capture_output=True)
    subprocess.run(
        [certutil, "-A", "-d", f"sql:{db}", "-n", "workbench-test-ca", "-t", "C,,", "-i", str(ca_pem)],
        check=True,
        capture_output=True,
    )
    os.chmod(home, 0o700)
    return home
