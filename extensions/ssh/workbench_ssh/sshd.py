"""``workbench-sshd PORT``: the user's OpenSSH server behind ``{base_url}sshd/``.

jupyter-server-proxy starts this (``jupyter_server_config.d/workbench_ssh.json``
names it as the ``sshd`` server, which takes the place of jupyter-sshd-proxy's
own entry) and tunnels the websocket's bytes to ``127.0.0.1:PORT``.

jupyter-sshd-proxy gives the base command: ``sshd -f none`` (no system config),
a host key kept in the home (``~/.ssh/jupyter_sshd_hostkey``, so a restarted
server shows clients the same key), listening on loopback only. Its defaults
leave password and keyboard-interactive login switched on and let any local
account try; the options added here make the rules explicit and independent of
what sshd could or could not verify as a non-root process:

* public keys only, from ``$HOME/.ssh/authorized_keys`` (the server's home, where the SSH page
  writes them; on the local backend that is the hub user's home, not the account's);
* no root login, and only the account that runs this server may log in;
* every session gets the server's GPU variables (``WORKBENCH_GPUS``,
  ``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``NVIDIA_VISIBLE_DEVICES``) and its ``PATH``, and
  nothing else from the server's environment (never the hub API token);
* keepalives both ways, so a live session keeps moving bytes through the proxy,
  which jupyter-server-proxy records as server activity (see docs/ssh.md).

It refuses to run as root: a root sshd would let every local account with an
``authorized_keys`` file in.
"""

from __future__ import annotations

import pwd
import os
import sys

#: variables a session inherits from the server, when the server has them
SESSION_VARIABLES = ("WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "PATH")

#: directories where Debian and conda put sshd (the local backend's PATH may lack sbin)
SBIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def session_environment(environ: dict[str, str]) -> list[str]:
    """``NAME=VALUE`` words for sshd's ``SetEnv``: the GPU variables and PATH, if set."""
    return [f"{name}={environ[name]}" for name in SESSION_VARIABLES if name in environ]


def quote_setenv(words: list[str]) -> str:
    # sshd splits SetEnv on whitespace unless a word is in double quotes
    return " ".join(f'"{w}"' if any(c.isspace() for c in w) else w for w in words)


def hardening_options(user: str, environ: dict[str, str], home: str | None = None) -> list[str]:
    """The ``-o`` options added to jupyter-sshd-proxy's command (sshd keeps the first value of each).

    ``home`` is the server's home, where the SSH page writes ``.ssh/authorized_keys``. sshd's own
    ``~`` is the account's home from passwd: the same in the image, but on the local backend every
    hub user's server runs as the hub's account with ``HOME`` set to that user's home, so the keys
    file is named by its absolute path."""
    options = [
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "PubkeyAuthentication yes",
        "AuthenticationMethods publickey",
        "PermitRootLogin no",
        f"AllowUsers {user}",
        "PermitUserEnvironment no",
        "StrictModes yes",
        "ClientAliveInterval 30",
        "ClientAliveCountMax 4",
        "PidFile none",
    ]
    if home:
        options.append(f"AuthorizedKeysFile {os.path.join(home, '.ssh', 'authorized_keys')}")
    env = session_environment(environ)
    if env:
        options.append("SetEnv " + quote_setenv(env))
    args: list[str] = []
    for option in options:
        args += ["-o", option]
    return args


def sshd_command(port: str, user: str, environ: dict[str, str], base_command: list[str],
                 home: str | None = None) -> list[str]:
    """jupyter-sshd-proxy's command with the port filled in and the hardening options appended.

    sshd keeps the first value of an option, so with ``home`` the base command's own relative
    ``AuthorizedKeysFile`` (resolved against the passwd home) is taken out rather than overridden."""
    base = [part.replace("{port}", port) for part in base_command]
    if home:
        kept: list[str] = []
        for part in base:
            if kept and kept[-1] == "-o" and part.split(None, 1)[0].lower() == "authorizedkeysfile":
                kept.pop()
                continue
            kept.append(part)
        base = kept
    return base + hardening_options(user, environ, home)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: workbench-sshd PORT  (started by jupyter-server-proxy at {base_url}sshd/)", file=sys.stderr)
        return 2
    if os.geteuid() == 0:
        print("workbench-sshd: refusing to run as root: the SSH server of a workbench server runs as its user",
              file=sys.stderr)
        return 1
    # jupyter-sshd-proxy finds sshd on PATH; the local backend's PATH may lack sbin
    path = os.environ.get("PATH", "")
    missing = [d for d in SBIN_DIRS if d not in path.split(os.pathsep)]
    search_path = os.pathsep.join([path, *missing]) if path else os.pathsep.join(missing)
    os.environ["PATH"] = search_path
    from jupyter_sshd_proxy import setup_sshd  # creates the home's host key on first start

    base = setup_sshd()["command"]
    if not base[0]:
        print("workbench-sshd: no sshd found (install Debian's openssh-server)", file=sys.stderr)
        return 1
    environ = dict(os.environ, PATH=path) if path else dict(os.environ)
    # the account sshd can log in (USER may name the hub user instead)
    command = sshd_command(argv[0], pwd.getpwuid(os.getuid()).pw_name, environ, base, os.path.expanduser("~"))
    os.execv(command[0], command)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
