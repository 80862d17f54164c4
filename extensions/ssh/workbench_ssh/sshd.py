"""``workbench-sshd PORT``: the user's OpenSSH server behind ``{base_url}sshd/``.

jupyter-server-proxy starts this (``workbench_ssh`` links it in as the ``sshd``
server, which takes the place of jupyter-sshd-proxy's own entry) and tunnels
the websocket's bytes to ``127.0.0.1:PORT``. ``workbench-sshd --check PORT``
prints the effective configuration (``sshd -T``) of exactly the command it
would run, for admins and the image tests.

jupyter-sshd-proxy gives the base command: ``sshd -f none`` (no system config),
a host key kept in the home (``~/.ssh/jupyter_sshd_hostkey``, so a restarted
server shows clients the same key), listening on loopback only. Its defaults
leave password and keyboard-interactive login switched on and let any local
account try; the options added here make the rules explicit and independent of
what sshd could or could not verify as a non-root process:

* public keys only, from ``$HOME/.ssh/authorized_keys`` (the server's home, where the SSH page
  writes them; on the local backend that is the hub user's home, not the account's);
* no root login, and only the account that runs this server may log in;
* every session lands in the server's home: ``SetEnv HOME=<home>`` and a ``ForceCommand``
  (``session.sh``) that enters the home before running the command, the sftp subsystem
  (``sftp-server -d <home>``) or a login shell; sshd itself would start in the account's
  passwd home, which on the local backend is not the server's;
* every session gets the server's GPU variables (``WORKBENCH_GPUS``,
  ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``NVIDIA_VISIBLE_DEVICES``) and its ``PATH``, and
  nothing else from the server's environment (never the hub API token);
* forwarding only as far as VS Code Remote-SSH and ``ssh -L``/``-D`` need it: local TCP
  forwarding; no agent, X11, Unix-socket, remote (``-R``) forwarding or tunnel devices;
* local forwards lead only to the server's own loopback (``PermitOpen localhost:* 127.0.0.1:*
  [::1]:*``), plus what the operator lists in ``WORKBENCH_SSH_PERMIT_OPEN`` (the hub checks it
  and sets it in the server's environment): a tunnel from a laptop does not reach other
  servers or the hub's internal API by default (docs/ssh.md says what it reaches per backend);
* keepalives both ways, so a live session keeps moving bytes through the proxy,
  which jupyter-server-proxy records as server activity (see docs/ssh.md).

It refuses to run as root: a root sshd would let every local account with an
``authorized_keys`` file in.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

#: variables a session inherits from the server, when the server has them
SESSION_VARIABLES = ("WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "PATH")

#: directories where Debian and conda put sshd (the local backend's PATH may lack sbin)
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")

#: where distributions put OpenSSH's sftp-server (Debian and Ubuntu first)
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)

#: the ForceCommand: enters the server's home, then runs the command, sftp or a login shell
SESSION_SCRIPT = Path(__file__).with_name("session.sh")

#: options of jupyter-sshd-proxy's command that ours replace: sshd keeps the first value of an
#: option (so its relative keys file would win) and refuses a second ``Subsystem sftp``
REPLACED_OPTIONS = ("authorizedkeysfile", "subsystem")

#: forwarding: ``ssh -L`` and ``-D`` (VS Code Remote-SSH tunnels its server this way), nothing else;
#: where they may lead is :func:`permit_open_option`'s PermitOpen
FORWARDING_OPTIONS = (
    "AllowTcpForwarding local",
    "AllowAgentForwarding no",
    "AllowStreamLocalForwarding no",
    "PermitTunnel no",
    "X11Forwarding no",
)

#: where local forwards may always go: the server's own loopback, any port
OWN_SERVER = ("localhost:*", "127.0.0.1:*", "[::1]:*")

#: the operator's further destinations, a comma list the hub checked at start (workbench_spawner/ssh_forwarding.py)
PERMIT_OPEN_VARIABLE = "WORKBENCH_SSH_PERMIT_OPEN"

#: one PermitOpen entry: host name, IPv4 or [IPv6] (or *), then a port (or *); nothing sshd's parser would split
PERMIT_OPEN_ENTRY = re.compile(
    r"(?:\*|[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\])"  # host
    r":(?:\*|[0-9]{1,5})"  # port
)


class SetupError(RuntimeError):
    """workbench-sshd cannot start; the message says what to install or fix."""


def sshd_word(word: str) -> str:
    """``word`` as one argument for sshd's option parser (which splits on whitespace, honours
    double quotes with backslash escapes, and treats an unquoted ``#`` as a comment)."""
    if word and not any(c.isspace() or c in "\"'\\#" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def session_environment(environ: dict[str, str], home: str | None = None) -> list[str]:
    """``NAME=VALUE`` words for sshd's ``SetEnv``: the GPU variables and PATH if set, and HOME."""
    words = [f"{name}={environ[name]}" for name in SESSION_VARIABLES if name in environ]
    if home is not None:
        words.append(f"HOME={home}")
    return words


def quote_setenv(words: list[str]) -> str:
    return " ".join(sshd_word(w) for w in words)


def permit_open_entry_ok(entry: str) -> bool:
    """True for ``host:port`` as the hub writes it (a port from 1 to 65535, or ``*``)."""
    port = entry.rpartition(":")[2]
    return bool(PERMIT_OPEN_ENTRY.fullmatch(entry)) and (port == "*" or 0 < int(port) < 65536)


def permit_open_option(environ: dict[str, str]) -> str:
    """The ``PermitOpen`` line: the server's own loopback and the hub's ``WORKBENCH_SSH_PERMIT_OPEN``.

    The hub has checked the value with sentences for the operator (this package cannot import the
    hub's); here only its shape is checked again, so that nothing but ``host:port`` words reaches
    sshd's command line, and a value that is not the hub's stops sshd rather than widen it."""
    extra = [e.strip() for e in environ.get(PERMIT_OPEN_VARIABLE, "").split(",") if e.strip()]
    if [e.lower() for e in extra] == ["any"]:
        return "PermitOpen any"
    bad = [e for e in extra if not permit_open_entry_ok(e)]
    if bad:
        raise SetupError(
            f"{PERMIT_OPEN_VARIABLE} in the server's environment holds {bad[0]!r}, not host:port "
            "(the hub checks this setting at start and sets it; ask a hub admin)"
        )
    return "PermitOpen " + " ".join(dict.fromkeys([*OWN_SERVER, *extra]))


def force_command(home: str, sftp_server: str) -> str:
    """The ``ForceCommand`` line. sshd hands it to the account's shell with ``-c``, so it is
    quoted for a POSIX shell; sshd keeps the line as written (it only checks the quotes balance)."""
    return " ".join(shlex.quote(w) for w in ("/bin/sh", str(SESSION_SCRIPT), home, sftp_server))


def hardening_options(user: str, environ: dict[str, str], home: str, sftp_server: str) -> list[str]:
    """The ``-o`` options added to jupyter-sshd-proxy's command (sshd keeps the first value of each).

    ``home`` is the server's home, where the SSH page writes ``.ssh/authorized_keys`` and where
    JupyterLab's file browser looks. sshd's own ``~`` is the account's home from passwd: the same
    in the image, but on the local backend every hub user's server runs as the hub's account with
    ``HOME`` set to that user's home, so the keys file is named by its absolute path and sessions
    are moved into the home by ``SetEnv HOME`` and the ``ForceCommand``."""
    # AuthorizedKeysFile expands %-tokens: a literal % is %%
    keys_file = os.path.join(home, ".ssh", "authorized_keys").replace("%", "%%")
    options = [
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "PubkeyAuthentication yes",
        "AuthenticationMethods publickey",
        "PermitRootLogin no",
        f"AllowUsers {user}",
        "PermitUserEnvironment no",
        "PermitUserRC no",
        "StrictModes yes",
        *FORWARDING_OPTIONS,
        permit_open_option(environ),
        "ClientAliveInterval 30",
        "ClientAliveCountMax 4",
        "PidFile none",
        f"AuthorizedKeysFile {sshd_word(keys_file)}",
        f"Subsystem sftp {sshd_word(sftp_server)}",
        f"ForceCommand {force_command(home, sftp_server)}",
        "SetEnv " + quote_setenv(session_environment(environ, home)),
    ]
    args: list[str] = []
    for option in options:
        args += ["-o", option]
    return args


def without_replaced_options(base: list[str]) -> list[str]:
    """``base`` without the ``-o`` options listed in :data:`REPLACED_OPTIONS`."""
    kept: list[str] = []
    for part in base:
        if kept and kept[-1] == "-o" and part.split(None, 1)[0].lower() in REPLACED_OPTIONS:
            kept.pop()
            continue
        kept.append(part)
    return kept


def sshd_command(
    port: str, user: str, environ: dict[str, str], base_command: list[str], home: str, sftp_server: str
) -> list[str]:
    """jupyter-sshd-proxy's command with the port filled in, its keys file and sftp subsystem
    taken out, and the hardening options appended."""
    base = [part.replace("{port}", port) for part in base_command]
    return without_replaced_options(base) + hardening_options(user, environ, home, sftp_server)


def search_path(path: str) -> str:
    """``path`` with the sbin directories added at the end where missing."""
    parts = [p for p in path.split(os.pathsep) if p]
    return os.pathsep.join(parts + [d for d in SBIN_DIRS if d not in parts])


def find_sftp_server() -> str:
    for candidate in SFTP_SERVERS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SetupError(
        "no sftp-server found (install Debian's openssh-sftp-server); looked in " + ", ".join(SFTP_SERVERS)
    )


def server_home(environ: dict[str, str]) -> str:
    """The server's home: ``$HOME`` (the spawner sets it), else the account's passwd home."""
    home = environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    if not os.path.isabs(home) or any(c in home for c in "\n\r\\"):
        # sshd's option parser reads a backslash as an escape even inside the ForceCommand's quotes
        raise SetupError(
            f"the server's home {home!r} is not an absolute path sshd can be given (no newlines or backslashes)"
        )
    if not os.path.isdir(home):
        raise SetupError(f"the server's home {home} does not exist")
    return home.rstrip("/") or "/"


def build_command(port: str, environ: dict[str, str]) -> list[str]:
    """The full sshd command ``workbench-sshd PORT`` runs, from the server's environment."""
    sshd = shutil.which("sshd", path=search_path(environ.get("PATH", "")))
    if sshd is None:
        raise SetupError("no sshd found (install Debian's openssh-server)")
    sftp_server = find_sftp_server()
    home = server_home(environ)
    from jupyter_sshd_proxy import setup_sshd  # creates the home's host key on first start

    base = list(setup_sshd()["command"])
    base[0] = sshd  # jupyter-sshd-proxy looks sshd up on PATH, which may lack sbin
    # the account sshd can log in (USER may name the hub user instead)
    user = pwd.getpwuid(os.getuid()).pw_name
    return sshd_command(port, user, environ, base, home, sftp_server)


# The only variables sshd itself is started with (locale and a search path for its own helpers).
SSHD_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "TZ")
USAGE = (
    "usage: workbench-sshd PORT          (started by jupyter-server-proxy at {base_url}sshd/)\n"
    "       workbench-sshd --check PORT  (print the effective sshd configuration, sshd -T)"
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    check = bool(argv) and argv[0] == "--check"
    if check:
        argv = argv[1:]
    if len(argv) != 1 or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    if os.geteuid() == 0:
        print(
            "workbench-sshd: refusing to run as root: the SSH server of a workbench server runs as its user",
            file=sys.stderr,
        )
        return 1
    try:
        command = build_command(argv[0], dict(os.environ))
    except SetupError as e:
        print(f"workbench-sshd: {e}", file=sys.stderr)
        return 1
    if check:
        result = subprocess.run([*command, "-T"], capture_output=True, text=True)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return result.returncode
    # sshd gets no variable of the server's (the hub API token above all): what sessions need is in
    # its SetEnv lines, and sshd needs nothing else.
    os.execve(command[0], command, {k: v for k, v in os.environ.items() if k in SSHD_ENVIRONMENT})
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
