"""Public keys in ``~/.ssh/authorized_keys``: validate one pasted key, add it once.

A key pasted into the browser is checked before anything is written: one line,
a known key type whose base64 body names the same type, no ``authorized_keys``
options (``command=``, ``from=``... would be a way to smuggle rules in), not a
private key, accepted by ``ssh-keygen -l`` (the same parser sshd uses), RSA at
least 2048 bits. A refused key leaves the file untouched. The file is rewritten
through a temporary file and a rename, so a crash never leaves half a line, and
``~/.ssh`` (0700) and the file (0600) get the modes sshd's StrictModes wants.
Adding is read-modify-write: it holds an exclusive ``flock`` on ``~/.ssh``
itself (no lock file left behind) from the read to the rename, so two adds at
once (two tabs, a script and the page) both land instead of one overwriting the
other.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import os
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
MIN_RSA_BITS = 2048
MAX_KEY_CHARS = 16384


class InvalidKeyError(ValueError):
    """A pasted key that cannot be used; the message is for the user."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    body: str
    comment: str
    fingerprint: str
    bits: int

    @property
    def line(self) -> str:
        return " ".join(p for p in (self.key_type, self.body, self.comment) if p)


def _embedded_type(blob: bytes) -> str:
    if len(blob) < 4:
        raise InvalidKeyError("The key's base64 part is too short to be an SSH public key.")
    (n,) = struct.unpack(">I", blob[:4])
    return blob[4 : 4 + n].decode("ascii", "replace")


def _fingerprint(line: str) -> tuple[int, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".pub") as f:
        f.write(line + "\n")
        f.flush()
        result = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", f.name], capture_output=True, text=True, timeout=10
        )
    if result.returncode != 0:
        raise InvalidKeyError(
            "OpenSSH does not accept this key (ssh-keygen -l refused it); paste the whole line of your .pub file."
        )
    bits, fingerprint = result.stdout.split()[:2]
    return int(bits), fingerprint


def parse_public_key(text: str) -> PublicKey:
    """The one public key in ``text``, or :class:`InvalidKeyError` saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidKeyError("Paste a public key: one line such as 'ssh-ed25519 AAAA... you@laptop'.")
    text = text.strip()
    if len(text) > MAX_KEY_CHARS:
        raise InvalidKeyError("That is far too long for one SSH public key.")
    if "PRIVATE KEY" in text:
        raise InvalidKeyError(
            "That is a PRIVATE key: never paste it anywhere. Paste the .pub file (e.g. ~/.ssh/id_ed25519.pub) instead."
        )
    if "\n" in text or "\r" in text:
        raise InvalidKeyError("Paste exactly one key, on one line (add several keys one at a time).")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise InvalidKeyError("The key contains control characters.")
    parts = text.split(None, 2)
    if parts[0] not in KEY_TYPES:
        raise InvalidKeyError(
            f"'{parts[0][:40]}' is not a supported key type (options such as command= are not accepted here); "
            f"use one of: {', '.join(KEY_TYPES)}."
        )
    if len(parts) < 2:
        raise InvalidKeyError("The key has a type but no base64 body.")
    key_type, body = parts[0], parts[1]
    comment = parts[2] if len(parts) > 2 else ""
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidKeyError("The key's second part is not valid base64; copy the whole line again.") from None
    if _embedded_type(blob) != key_type:
        raise InvalidKeyError("The key's body does not match its type; copy the whole line again.")
    bits, fingerprint = _fingerprint(f"{key_type} {body}")
    if key_type == "ssh-rsa" and bits < MIN_RSA_BITS:
        raise InvalidKeyError(f"This RSA key has {bits} bits; at least {MIN_RSA_BITS} are needed (ed25519 is better).")
    return PublicKey(key_type, body, comment, fingerprint, bits)


def authorized_keys_path(home: str | os.PathLike) -> Path:
    return Path(home) / ".ssh" / "authorized_keys"


def listed_keys(home: str | os.PathLike) -> list[dict[str, str]]:
    """The keys in ``authorized_keys`` (type, fingerprint, comment); unreadable lines are skipped."""
    path = authorized_keys_path(home)
    if not path.exists():
        return []
    keys = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            key = parse_public_key(line)
        except InvalidKeyError:
            continue  # a line with options, written by hand: not ours to judge here
        keys.append({"type": key.key_type, "fingerprint": key.fingerprint, "comment": key.comment})
    return keys


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (flock on the directory itself) for the block."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def add_key(home: str | os.PathLike, text: str) -> tuple[PublicKey, bool]:
    """Add the key in ``text``; returns it and whether it was new (False: already there)."""
    key = parse_public_key(text)
    path = authorized_keys_path(home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with _locked(path.parent):
        existing = path.read_text(errors="replace") if path.exists() else ""
        for line in existing.splitlines():
            words = line.split()
            if key.body in words:
                return key, False
        content = existing + ("" if not existing or existing.endswith("\n") else "\n") + key.line + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".authorized_keys.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return key, True
