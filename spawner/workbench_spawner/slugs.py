"""User names as directory names: collision-free by construction.

The local backend keeps each user's home in ``<data dir>/homes/<slug>``. Two
different user names must never get the same slug, or two people share a
home. The first version of this mapping (kept below as
:func:`legacy_dir_name`) escaped unsafe characters as ``-<hex>-`` but left
the escape character ``-`` itself alone, so ``müller`` and ``m-fc-ller`` (and
``a~b`` and ``a-7e-b``) both became ``m-fc-ller`` (``a-7e-b``).

The slug rule (:func:`dir_slug`)
--------------------------------
* ``[A-Za-z0-9_.@+]`` stand for themselves, except a ``.`` as the first
  character (so no slug is ``.``, ``..`` or a hidden directory);
* every other character, **the escape character ``-`` included**, becomes
  ``-<hex>-``: its code point in lowercase hex without leading zeros
  (``-`` -> ``-2d-``, ``ü`` -> ``-fc-``, ``/`` -> ``-2f-``);
* a slug longer than ``max_length`` (255, the file-name limit of Linux file
  systems) is cut at a token boundary and ends in ``-hash-`` plus 32 hex
  digits of the SHA-256 of the name.

Why it is collision-free: a slug is a sequence of tokens, and the token set is
prefix-free. A token that starts with a safe character is that one character;
a token that starts with ``-`` runs to the next ``-`` (hex digits contain no
``-``), and a literal ``-`` never occurs outside a token. So the token
sequence, and from it the name, is read back from the slug without any
choice: :func:`name_of_slug` does exactly that, and the tests check
``name_of_slug(dir_slug(n)) == n``. A function with an inverse is injective.
A long name's slug contains ``-hash-``, which is not a token (``h`` is not a
hex digit), so it can never equal a short slug; two long slugs are equal only
if 128 bits of SHA-256 are, which no one will see.

Every slug is one path component: only ``[A-Za-z0-9_.@+-]``, never empty,
never ``.``/``..``, at most ``max_length`` characters (all ASCII, so bytes).
Case is kept (``Alice`` and ``alice`` are different slugs), as Linux file
systems are case-sensitive; on a case-insensitive file system (macOS
default) two names that differ only in case would share a home, which is one
more reason JupyterHub's default of lower-casing user names should stay on.

Existing homes (:func:`home_dir`)
---------------------------------
Names made only of ``[A-Za-z0-9_.@+]`` and not starting with ``.`` get the
same directory as before, so almost every existing home is found untouched.
For any other name the old directory may exist under the old name. It is
used when, and only when, it is unambiguously this user's:

1. the new directory does not exist (once it exists, it wins for good);
2. the old directory exists;
3. no other name has the old directory as its *new* slug (``m-fc-ller``'s old
   directory is ``müller``'s new one, so it stays ``müller``'s);
4. the old function mapped no other name to it (``a-7e-b-c`` was also the
   old directory of ``a~b-c``: two people may have shared it, and which
   files are whose is for a person to decide).

It is used in place, never renamed: the hub may be computing the path while
the user's server runs from it (servers survive a hub restart). When rules 3
or 4 keep a user from their old directory they get a fresh home and the
spawner logs a warning that names both directories, so an operator can move
the files by hand.

Docker volume names (``workbench-home-{username}``) do not use this module:
DockerSpawner 14 fills ``{username}`` with its own escape, which keeps only
``[a-z0-9]`` and writes every other byte of the UTF-8 encoding, ``-``
included, as ``-`` plus exactly two hex digits. That is collision-free for
the same reason (every ``-`` starts a three-character token), so existing
volume names need no change; the tests check it on the same table of names.
"""

from __future__ import annotations

import hashlib
import os
import re
import string
from collections.abc import Callable
from typing import NamedTuple

SAFE = frozenset(string.ascii_letters + string.digits + "_.@+")
ESCAPE = "-"
MAX_LENGTH = 255  # NAME_MAX on Linux file systems
HASH_MARK = "-hash-"  # '-' then 'h': not a token, so no short slug contains it
HASH_DIGITS = 32

_HEX = re.compile(r"[0-9a-f]+")
# What the first version left alone: it did not escape '-'.
_LEGACY_SAFE = frozenset(string.ascii_letters + string.digits + "_.@+-")


def _token(char: str, first: bool) -> str:
    if char in SAFE and not (first and char == "."):
        return char
    return f"{ESCAPE}{ord(char):x}{ESCAPE}"


def dir_slug(name: str, max_length: int = MAX_LENGTH) -> str:
    """The one directory name for ``name``; see the module docstring for the rule.

    Raises ValueError for an empty name: JupyterHub has no such user, and a
    home that belongs to nobody is a bug to surface, not a directory to make.
    """
    if not name:
        raise ValueError("a user name cannot be empty")
    minimum = len(HASH_MARK) + HASH_DIGITS + 1
    if max_length < minimum:
        raise ValueError(f"max_length must be at least {minimum}, got {max_length}")
    tokens = [_token(char, i == 0) for i, char in enumerate(name)]
    slug = "".join(tokens)
    if len(slug) <= max_length:
        return slug
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]
    room = max_length - len(HASH_MARK) - HASH_DIGITS
    prefix, used = [], 0
    for token in tokens:  # cut between tokens, so the prefix still reads back
        if used + len(token) > room:
            break
        prefix.append(token)
        used += len(token)
    return "".join(prefix) + HASH_MARK + digest


def name_of_slug(slug: str) -> str | None:
    """The name whose :func:`dir_slug` is ``slug``, or None if there is none.

    Strict: only the exact spelling :func:`dir_slug` writes is accepted (no
    upper-case hex, no leading zeros, no escaped safe character), so this is
    the inverse of :func:`dir_slug` on short slugs. A hashed long slug gives
    None: its name cannot be read back, and no short slug equals it.
    """
    out: list[str] = []
    i = 0
    while i < len(slug):
        char = slug[i]
        if char == ESCAPE:
            end = slug.find(ESCAPE, i + 1)
            digits = slug[i + 1 : end] if end > 0 else ""
            if not _HEX.fullmatch(digits) or digits != f"{int(digits, 16):x}" or int(digits, 16) > 0x10FFFF:
                return None
            char = chr(int(digits, 16))
            if _token(char, i == 0) == char:
                return None  # a safe character that dir_slug would not have escaped
            i = end + 1
        elif _token(char, i == 0) == char:
            i += 1
        else:
            return None
        out.append(char)
    return "".join(out) or None


def legacy_dir_name(name: str) -> str:
    """The first version's directory name, kept only to find existing homes.

    Not collision-free: ``-`` was not escaped (see the module docstring).
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.@+-]", lambda m: f"-{ord(m.group()):x}-", name)
    return cleaned if cleaned.strip(".") else f"user-{cleaned.encode().hex()}"


def legacy_owner_count(dir_name: str, cap: int = 2) -> int:
    """How many user names :func:`legacy_dir_name` mapped to ``dir_name`` (at most ``cap``).

    Counts the ways to read ``dir_name`` as the old function's output: each
    ``-`` is either a literal ``-`` or opens a ``-<hex>-`` escape of a
    character the old function escaped; plus the all-dots names it wrote as
    ``user-2e2e...``. Linear time (one pass from the end), capped so that a
    name with many ``-`` cannot make the count huge.
    """
    count = 0
    if re.fullmatch(r"user-(2e)*", dir_name):
        count += 1  # the name made of len/2 dots (the old function's special case)
    if dir_name.strip("."):
        ways = [0] * (len(dir_name) + 1)
        ways[len(dir_name)] = 1
        for i in range(len(dir_name) - 1, -1, -1):
            char = dir_name[i]
            total = ways[i + 1] if char in _LEGACY_SAFE else 0
            if char == "-":
                end = dir_name.find("-", i + 1)
                digits = dir_name[i + 1 : end] if end > 0 else ""
                if (
                    _HEX.fullmatch(digits)
                    and digits == f"{int(digits, 16):x}"
                    and int(digits, 16) <= 0x10FFFF
                    and chr(int(digits, 16)) not in _LEGACY_SAFE
                ):
                    total += ways[end + 1]
            ways[i] = min(total, cap)
        count += ways[0]
    return min(count, cap)


class HomeChoice(NamedTuple):
    """The home directory for one user, and a warning for the operator if any."""

    path: str
    warning: str | None = None


def home_dir(template: str, name: str, isdir: Callable[[str], bool] = os.path.isdir) -> HomeChoice:
    """The home of ``name`` under ``template`` (``{username}`` is the slug).

    New slug, unless an existing old-style directory is unambiguously this
    user's (the four rules in the module docstring). ``isdir`` is there for
    tests; the file system is only read, never changed.
    """
    new_slug, old_slug = dir_slug(name), legacy_dir_name(name)
    new = template.format(username=new_slug)
    old = template.format(username=old_slug)
    if new == old or isdir(new) or not isdir(old):
        return HomeChoice(new)
    other = name_of_slug(old_slug)
    if other is not None:
        return HomeChoice(
            new,
            f"Home of {name!r}: {old} (its directory before names were escaped "
            f"collision-free) is now the home of {other!r}, so {name!r} gets {new}; "
            f"move files from {old} to {new} by hand if they are {name!r}'s",
        )
    if legacy_owner_count(old_slug) > 1:
        return HomeChoice(
            new,
            f"Home of {name!r}: {old} (its directory before names were escaped "
            f"collision-free) may have been shared with another user whose name "
            f"mapped there too, so {name!r} gets {new}; move files by hand if they are theirs",
        )
    return HomeChoice(old)
