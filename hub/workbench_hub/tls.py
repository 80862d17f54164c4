"""HTTPS for the hub: is an address loopback, and is this certificate usable?

Passwords (NativeAuthenticator) and API tokens are typed into the hub's
pages, so a hub that other machines can reach must serve HTTPS, or sit behind
a proxy that does (README, "Serving other machines"). The config file checks
two things at start, before anything listens:

* :func:`is_loopback`: may this address serve plain HTTP? Only loopback
  (``127.0.0.0/8``, ``::1``, ``localhost``) may; ``0.0.0.0``, ``::``, an
  empty host (all addresses), a LAN address or a host name may not.
* :func:`check_certificate`: the operator's certificate and key
  (``WORKBENCH_SSL_CERT``, ``WORKBENCH_SSL_KEY``) are files this process
  can read, the certificate is PEM (the first one in the file is the
  server's; intermediates may follow), the key is an unencrypted PEM private
  key, the key belongs to the certificate, and the certificate is valid now.
  configurable-http-proxy would otherwise start and fail later, or serve a
  certificate every browser rejects; each problem is one sentence in a
  :class:`TLSError`.

Uses ``cryptography``, which JupyterHub already depends on (through certipy).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path


class TLSError(ValueError):
    """A certificate or key that cannot be served; the message says which file and why."""


@dataclass(frozen=True)
class CertificateInfo:
    """What the banner tells the operator about the certificate being served."""

    subject: str
    names: tuple[str, ...]  # DNS names and IP addresses of the subjectAltName (or the CN)
    not_after: dt.datetime  # UTC

    def days_left(self, now: dt.datetime | None = None) -> float:
        now = now or dt.datetime.now(dt.UTC)
        return (self.not_after - now).total_seconds() / 86400


def is_loopback(host: str | None) -> bool:
    """True when only this machine can reach ``host`` (an address or ``localhost``)."""
    host = (host or "").strip().strip("[]").lower()
    if host in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        # '' (every address), a host name other than localhost: other machines may reach it
        return False


def _read(path_text: str, variable: str) -> bytes:
    path = Path(path_text)
    try:
        if path.is_dir():
            raise TLSError(f"{variable}={path_text} is not a file")
        return path.read_bytes()
    except FileNotFoundError:
        raise TLSError(f"{variable}={path_text} does not exist") from None
    except PermissionError:
        # the file, or a directory on its way, is closed to this user
        raise TLSError(
            f"{variable}={path_text} cannot be read by the hub (uid {os.geteuid()}): "
            "make it readable by this user, e.g. chmod 0640 and chgrp to the hub's group"
        ) from None
    except OSError as exc:
        raise TLSError(f"{variable}={path_text} cannot be read: {exc.strerror or exc}") from None


def _names(cert) -> tuple[str, ...]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return tuple(a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME))
    return tuple(san.get_values_for_type(x509.DNSName)) + tuple(
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    )


def check_certificate(
    cert_path: str,
    key_path: str,
    now: dt.datetime | None = None,
    cert_variable: str = "WORKBENCH_SSL_CERT",
    key_variable: str = "WORKBENCH_SSL_KEY",
) -> CertificateInfo:
    """Check that configurable-http-proxy can serve ``cert_path`` with ``key_path`` now.

    Raises :class:`TLSError` naming the variable, the path and the problem.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_data = _read(cert_path, cert_variable)
    key_data = _read(key_path, key_variable)

    if b"-----BEGIN CERTIFICATE-----" not in cert_data:
        hint = ""
        if cert_data[:1] == b"\x30":
            hint = f" (it looks like DER: convert it with openssl x509 -inform der -in {cert_path} -out cert.pem)"
        elif b"PRIVATE KEY-----" in cert_data:
            hint = " (it holds a private key: WORKBENCH_SSL_KEY names the key, WORKBENCH_SSL_CERT the certificate)"
        raise TLSError(f"{cert_variable}={cert_path} is not a PEM certificate{hint}")
    try:
        chain = x509.load_pem_x509_certificates(cert_data)
    except ValueError as exc:
        raise TLSError(f"{cert_variable}={cert_path} is not a PEM certificate ({exc})") from None
    cert = chain[0]

    if b"ENCRYPTED" in key_data.split(b"-----END", 1)[0]:
        raise TLSError(
            f"{key_variable}={key_path} is encrypted and configurable-http-proxy cannot ask for its passphrase: "
            f"decrypt it with openssl pkey -in {key_path} -out key.pem and keep that file private"
        )
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError) as exc:
        kind = "a certificate, not a key" if b"BEGIN CERTIFICATE" in key_data else "not a PEM private key"
        raise TLSError(
            f"{key_variable}={key_path} is {kind}" + ("" if "certificate" in kind else f" ({exc})")
        ) from None

    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        raise TLSError(
            f"{key_variable}={key_path} is not the key of the certificate in {cert_variable}={cert_path} "
            "(their public keys differ)"
        )

    now = now or dt.datetime.now(dt.UTC)
    subject = cert.subject.rfc4514_string() or "(no subject)"
    not_before, not_after = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= not_after:
        raise TLSError(
            f"the certificate in {cert_variable}={cert_path} ({subject}) expired on "
            f"{not_after:%Y-%m-%d %H:%M} UTC: renew it"
        )
    if now < not_before:
        raise TLSError(
            f"the certificate in {cert_variable}={cert_path} ({subject}) is not valid before "
            f"{not_before:%Y-%m-%d %H:%M} UTC: check this machine's clock or the certificate"
        )
    return CertificateInfo(subject=subject, names=_names(cert), not_after=not_after)


def hsts(max_age: int) -> str:
    """The Strict-Transport-Security value: this host only (no includeSubDomains, no preload)."""
    return f"max-age={max_age}"


def covers(names: tuple[str, ...] | list[str], host: str) -> bool:
    """Does a certificate with these subjectAltNames serve ``host``? A ``*.`` name covers one label
    (``*.hub.example.edu`` covers ``bob.hub.example.edu``, not ``hub.example.edu`` nor ``a.b.hub.example.edu``),
    as browsers match them (RFC 6125)."""
    host = host.lower().rstrip(".")
    for name in (n.lower().rstrip(".") for n in names):
        if name == host:
            return True
        if name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]:
            return True
    return False
