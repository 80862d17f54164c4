"""Where SSH port forwarding into a server may lead: the operator's ``WORKBENCH_SSH_PERMIT_OPEN``.

A student's ``ssh -L``/``-D`` (and ``-W``, ProxyJump) through the hub opens
connections from inside their server, so without a rule the forward reaches
whatever the server's network reaches: other students' containers, the hub's
internal API. The server's sshd (``workbench_ssh/sshd.py``) therefore allows
forwards only to the server's own loopback (``localhost``, ``127.0.0.1``,
``[::1]``, any port) unless the operator lists more here. The hub checks the
list at start (a bad entry stops it with a sentence) and hands it to every
server as ``WORKBENCH_SSH_PERMIT_OPEN``; the server cannot import this module
(the image carries ``workbench_ssh``, not the hub's packages), so it only
re-checks the entries' shape before the value reaches sshd's command line.

It scopes SSH's forwarding channels, not the server's network: a session runs
commands, and a command reaches whatever the server can reach. Keeping servers
apart on the network is the backend's job (docs/ssh.md, "Where forwards lead").

The entries are sshd's ``PermitOpen`` syntax (``host:port``, ``[IPv6]:port``,
``*`` for every port or every host) or the single word ``any``. sshd matches
them against the destination exactly as the client wrote it, unresolved.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable

from traitlets import List, TraitError, Unicode, default, validate
from traitlets.config import Config, Configurable
from traitlets.utils.bunch import Bunch

from workbench_spawner.config_sections import read_as

#: the operator's variable, and the name the hub gives the value in the servers' environment
ENV = "WORKBENCH_SSH_PERMIT_OPEN"
EXAMPLE = "db.internal:5432,10.0.0.7:*"
#: a host name as sshd takes it (letters, digits, dots, dashes, underscores)
HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})")
PORT = re.compile(r"[0-9]{1,5}")


class PermitOpenError(ValueError):
    """An entry sshd's PermitOpen cannot take, or that would not mean what it seems; the message says which."""


def _port(entry: str, port: str, source: str) -> str:
    if port == "*":
        return port
    if not PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise PermitOpenError(f"{source}: in {entry!r} the port must be a number from 1 to 65535 or *, not {port!r}")
    return str(int(port))


def permit_open_entry(entry: str, source: str = ENV) -> str:
    """One ``host:port`` entry, checked (ports without leading zeros); PermitOpenError with a sentence."""
    if any(c.isspace() for c in entry):
        raise PermitOpenError(f"{source}: {entry!r} has a space: separate entries with commas, e.g. {EXAMPLE}")
    if entry.startswith("["):
        address, bracket, port = entry[1:].partition("]")
        if not bracket or not port.startswith(":"):
            raise PermitOpenError(
                f"{source}: write an IPv6 address as [address]:port, e.g. [fd00::7]:8888, not {entry!r}"
            )
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise PermitOpenError(f"{source}: in {entry!r}, {address!r} is not an IPv6 address") from None
        return f"[{address}]:{_port(entry, port[1:], source)}"
    host, colon, port = entry.rpartition(":")
    if not colon:
        raise PermitOpenError(
            f"{source}: {entry!r} has no port: write host:port, e.g. {entry}:8888, or {entry}:* for every port"
        )
    if ":" in host:
        raise PermitOpenError(
            f"{source}: {entry!r} has more than one ':': write host:port, and an IPv6 address in brackets, "
            "e.g. [::1]:8888"
        )
    if not host:
        raise PermitOpenError(f"{source}: {entry!r} has no host: write host:port, e.g. db.internal{entry}")
    if host != "*" and not HOST_NAME.fullmatch(host):
        raise PermitOpenError(
            f"{source}: in {entry!r}, {host!r} is not a host name or address (letters, digits, '.', '-', '_')"
        )
    return f"{host}:{_port(entry, port, source)}"


def check_entries(entries: Iterable[str], source: str = ENV) -> list[str]:
    """The entries checked and without repeats, ``["any"]`` for any, ``[]`` for the default."""
    items = [str(e).strip() for e in entries if str(e).strip()]
    if any(item.lower() == "any" for item in items):
        if len(items) > 1:
            raise PermitOpenError(
                f"{source}: 'any' lets forwards reach every address and stands alone, not with {items!r}"
            )
        return ["any"]
    if any(item.lower() == "none" for item in items):
        raise PermitOpenError(
            f"{source}: 'none' is not offered: the server's own loopback stays open to forwards "
            "(VS Code Remote-SSH tunnels to it); leave the setting empty for only that"
        )
    checked = [permit_open_entry(item, source) for item in items]
    return list(dict.fromkeys(checked))


def parse_permit_open(text: str, source: str = ENV) -> list[str]:
    """``WORKBENCH_SSH_PERMIT_OPEN``'s comma list, checked (see :func:`check_entries`)."""
    return check_entries(text.split(","), source)


class SSHForwarding(Configurable):
    """Where SSH forwards into a server may lead (``ssh_permit_open``); a base of GPUSpawnerMixin, which hands
    it to every server's sshd through the environment (``ssh_environment``)."""

    ssh_permit_open = List(
        Unicode(),
        help="""
        Where a user's SSH port forwards (``ssh -L``, ``-D``, ``-W``) may lead
        besides their own server, whose loopback (``localhost``,
        ``127.0.0.1``, ``[::1]``, any port) is always allowed. Entries in
        sshd's ``PermitOpen`` syntax, matched against the destination as the
        client writes it (names are not resolved): ``host:port``,
        ``[IPv6]:port``, ``*`` for every port; ``["any"]`` lifts the rule. A
        bad entry stops the hub at start with a sentence. What a forward can
        reach on each backend: docs/ssh.md.

        Defaults to $WORKBENCH_SSH_PERMIT_OPEN, a comma list
        (``db.internal:5432,10.0.0.7:*``, or ``any``); unset or empty,
        forwards reach only the user's own server. Example::

            c.GPUSpawnerMixin.ssh_permit_open = ["db.internal:5432", "10.0.0.7:*"]
        """,
    ).tag(config=True)

    @default("ssh_permit_open")
    def _default_ssh_permit_open(self) -> list[str]:
        try:
            return parse_permit_open(os.environ.get(ENV, ""), ENV)
        except PermitOpenError as exc:
            raise TraitError(str(exc)) from None

    @validate("ssh_permit_open")
    def _check_ssh_permit_open(self, proposal: Bunch) -> list[str]:
        try:
            return check_entries(proposal["value"], "ssh_permit_open")
        except PermitOpenError as exc:
            raise TraitError(str(exc)) from None

    def ssh_environment(self) -> dict[str, str]:
        """The server's ``WORKBENCH_SSH_PERMIT_OPEN`` (empty: the server's own loopback only)."""
        return {ENV: ",".join(self.ssh_permit_open)}


def ssh_forwarding_problems(config: Config, spawner_class: type[Configurable]) -> list[str]:
    """Sentences for a bad ``ssh_permit_open`` (or $WORKBENCH_SSH_PERMIT_OPEN) in the hub's final config.

    Read as ``spawner_class`` would read it (its config sections and its bases'), without making a
    spawner (a spawner needs a user), so the hub stops at start instead of failing every spawn."""
    try:
        # A dynamic default is read, and checked, on access.
        _permit_open = read_as(SSHForwarding, spawner_class, config).ssh_permit_open
    except TraitError as exc:
        return [str(exc)]
    return []
