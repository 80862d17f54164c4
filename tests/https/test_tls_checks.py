"""workbench_hub.tls: which addresses may serve plain HTTP, and which certificates the hub refuses to serve."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.https.certs import CA, NOW, cert_pem, key_pem
from workbench_hub import tls


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        (None, False),
        ("10.0.0.5", False),
        ("192.168.1.20", False),
        ("fe80::1", False),
        ("gpu.example.org", False),
        ("localhost.example.org", False),
    ],
)
def test_only_loopback_may_serve_plain_http(host, loopback):
    assert tls.is_loopback(host) is loopback


@pytest.fixture(scope="module")
def ca():
    return CA.make()


def test_a_good_certificate_with_its_chain_is_accepted(ca, tmp_path):
    cert, key = ca.write(tmp_path, "hub", "workbench.test", "127.0.0.1")
    info = tls.check_certificate(str(cert), str(key))
    assert info.names == ("workbench.test", "127.0.0.1")
    assert info.subject == "CN=workbench.test"
    assert 28 < info.days_left() < 31


def _write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def bad_cases(ca, tmp_path):
    """(cert path, key path, the sentence's telling part) for every refusal."""
    cert, key = ca.write(tmp_path, "good", "workbench.test")
    cert, key = str(cert), str(key)
    other_cert, other_key = ca.write(tmp_path, "other", "workbench.test")
    expired, expired_key = ca.write(
        tmp_path,
        "expired",
        "workbench.test",
        not_before=NOW - dt.timedelta(days=60),
        not_after=NOW - dt.timedelta(days=1),
    )
    future, future_key = ca.write(
        tmp_path,
        "future",
        "workbench.test",
        not_before=NOW + dt.timedelta(days=2),
        not_after=NOW + dt.timedelta(days=60),
    )
    leaf, leaf_key = ca.issue("workbench.test")
    der = _write(tmp_path, "cert.der", leaf.public_bytes(serialization.Encoding.DER))
    garbage = _write(tmp_path, "garbage.pem", b"hello, I am not a certificate\n")
    broken = _write(tmp_path, "broken.pem", b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
    encrypted = _write(tmp_path, "encrypted-key.pem", key_pem(leaf_key, b"secret"))
    leaf_cert = _write(tmp_path, "leaf.pem", cert_pem(leaf))
    missing = str(tmp_path / "nowhere" / "cert.pem")
    return [
        (missing, key, f"WORKBENCH_SSL_CERT={missing} does not exist"),
        (cert, missing, f"WORKBENCH_SSL_KEY={missing} does not exist"),
        (str(tmp_path), key, f"WORKBENCH_SSL_CERT={tmp_path} is not a file"),
        (garbage, key, f"WORKBENCH_SSL_CERT={garbage} is not a PEM certificate"),
        (der, key, "is not a PEM certificate (it looks like DER: convert it with openssl x509 -inform der"),
        (key, cert, f"WORKBENCH_SSL_CERT={key} is not a PEM certificate (it holds a private key:"),
        (broken, key, f"WORKBENCH_SSL_CERT={broken} is not a PEM certificate ("),
        (cert, garbage, f"WORKBENCH_SSL_KEY={garbage} is not a PEM private key"),
        (cert, cert, f"WORKBENCH_SSL_KEY={cert} is a certificate, not a key"),
        (leaf_cert, encrypted, f"WORKBENCH_SSL_KEY={encrypted} is encrypted and configurable-http-proxy cannot ask"),
        (
            cert,
            str(other_key),
            f"WORKBENCH_SSL_KEY={other_key} is not the key of the certificate in "
            f"WORKBENCH_SSL_CERT={cert} (their public keys differ)",
        ),
        (
            str(expired),
            str(expired_key),
            f"the certificate in WORKBENCH_SSL_CERT={expired} (CN=workbench.test) "
            f"expired on {(NOW - dt.timedelta(days=1)):%Y-%m-%d}",
        ),
        (str(future), str(future_key), "is not valid before"),
    ], other_cert


def test_every_bad_certificate_or_key_is_one_sentence(ca, tmp_path):
    cases, _ = bad_cases(ca, tmp_path)
    for cert, key, sentence in cases:
        with pytest.raises(tls.TLSError) as raised:
            tls.check_certificate(cert, key)
        message = str(raised.value)
        assert sentence in message, (cert, key, message)
        assert "\n" not in message
        assert "Traceback" not in message


def test_expiry_is_checked_against_the_clock_given(ca, tmp_path):
    cert, key = ca.write(tmp_path, "hub", "workbench.test")
    tls.check_certificate(str(cert), str(key), now=NOW + dt.timedelta(days=29))
    with pytest.raises(tls.TLSError, match="expired on"):
        tls.check_certificate(str(cert), str(key), now=NOW + dt.timedelta(days=31))


def _check_as(uid: int | None, cert, key) -> str:
    """tls.check_certificate in a forked child running as ``uid`` (root reads any file); its sentence."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to the user, check, report, leave without pytest's clean-up
        try:
            os.close(read)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            try:
                tls.check_certificate(str(cert), str(key))
                message = "accepted"
            except tls.TLSError as exc:
                message = str(exc)
            os.write(write, message.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


def test_an_unreadable_key_is_refused_with_the_user_named(ca, request_cleanup):
    # pytest's base directory is closed to other users: a world-readable directory of our own
    tmp_path = Path(tempfile.mkdtemp(prefix="wb-tls-"))
    request_cleanup.append(tmp_path)
    tmp_path.chmod(0o755)
    cert, key = ca.write(tmp_path, "hub", "workbench.test")
    cert.chmod(0o644)
    key.chmod(0o600)
    uid = 65534 if os.geteuid() == 0 else None  # as the unprivileged user a hub image would run as
    if uid is not None:
        os.chown(key, 0, 0)
    else:
        key.chmod(0o000)
    message = _check_as(uid, cert, key)
    assert message == (
        f"WORKBENCH_SSL_KEY={key} cannot be read by the hub (uid {uid if uid is not None else os.geteuid()}): "
        "make it readable by this user, e.g. chmod 0640 and chgrp to the hub's group"
    )


@pytest.fixture
def request_cleanup():
    paths: list[Path] = []
    yield paths
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
