"""Start configurable-http-proxy with only the environment it needs.

JupyterHub starts the proxy with a copy of the hub's whole environment (plus
``CONFIGPROXY_AUTH_TOKEN``): ``ConfigurableHTTPProxy.start`` passes
``os.environ.copy()``. The hub's environment holds what the proxy never
uses and must not hold: ``WORKBENCH_ADMIN_TOKEN`` and
``WORKBENCH_METRICS_TOKEN`` (API tokens), ``JPY_COOKIE_SECRET`` (signs every
session), ``WORKBENCH_DB_URL`` (may carry a database password). The proxy
is the one process that faces the network; whatever it holds, a flaw in it
or in Node.js could hand out. So the hub starts it through this launcher,
which keeps an allow-list and replaces itself with the proxy (``exec``: same
pid, so JupyterHub's pid file and its signals reach the proxy itself)::

    python -m workbench_hub.proxy_env [--keep=NAME,NAME...] -- CHP [ARG...]

Kept: what Node.js and the proxy read (:data:`KEEP`, :data:`KEEP_PREFIXES`),
and the names an operator adds with ``WORKBENCH_PROXY_ENV_KEEP`` (a comma
list, passed here as ``--keep``): an outgoing HTTP proxy, say. Node's
variables are named one by one rather than ``NODE_*``: ``NODE_AUTH_TOKEN``
is npm's registry token, a secret of exactly the kind this keeps out.

:func:`proxy_command` builds the command the hub config sets as
``c.ConfigurableHTTPProxy.command``; JupyterHub appends its own arguments
(``--ip``, ``--port``, ``--api-port``, ``--ssl-key``...) and ``transport.py``
appends ``--no-x-forward``: everything after ``--`` goes to the proxy as it is.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from workbench_hub.env_values import ConfigError, Env, comma_list

USAGE = "usage: python -m workbench_hub.proxy_env [--keep=NAME,NAME...] -- CHP [ARG...]"
LAUNCHER = [sys.executable, "-m", "workbench_hub.proxy_env"]

# What Node.js and configurable-http-proxy read from the environment.
KEEP = frozenset(
    {
        "PATH",  # the proxy's `#!/usr/bin/env node` finds node on it
        "HOME",
        "TMPDIR",
        "TZ",  # the time stamps in the proxy's log
        "LANG",
        "LANGUAGE",
        # Node.js (https://nodejs.org/api/cli.html#environment-variables), each by name
        "NODE_OPTIONS",
        "NODE_EXTRA_CA_CERTS",
        "NODE_ICU_DATA",
        "NODE_PATH",
        "NODE_NO_WARNINGS",
        "NODE_PENDING_DEPRECATION",
        "NODE_PRESERVE_SYMLINKS",
        "NODE_REDIRECT_WARNINGS",
        "NODE_TLS_REJECT_UNAUTHORIZED",
        "NODE_USE_ENV_PROXY",
        "UV_THREADPOOL_SIZE",
        # OpenSSL, which Node.js serves TLS with
        "OPENSSL_CONF",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
    }
)
# LC_* (locale) and CONFIGPROXY_* (the proxy's own: CONFIGPROXY_AUTH_TOKEN, the key passphrases).
KEEP_PREFIXES = ("LC_", "CONFIGPROXY_")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def kept(name: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether the proxy gets the variable ``name``."""
    return name in KEEP or name in extra or name.startswith(KEEP_PREFIXES)


def proxy_environment(environ: Mapping[str, str], extra: frozenset[str] = frozenset()) -> dict[str, str]:
    """The part of ``environ`` the proxy gets: the allow-list and the operator's ``extra`` names."""
    return {name: value for name, value in environ.items() if kept(name, extra)}


def keep_names(env: Env) -> list[str]:
    """The names in WORKBENCH_PROXY_ENV_KEEP, checked (a typo would silently keep nothing)."""
    names = comma_list(env, "WORKBENCH_PROXY_ENV_KEEP")
    bad = [name for name in names if not _NAME.match(name)]
    if bad:
        raise ConfigError(
            f"WORKBENCH_PROXY_ENV_KEEP must be a comma list of environment variable names "
            f"(letters, digits, _), such as HTTP_PROXY,NO_PROXY; {bad[0]!r} is not one"
        )
    return names


def proxy_command(env: Env, repo: Path) -> list[str]:
    """``c.ConfigurableHTTPProxy.command``: the checkout's proxy (else the one on PATH) behind this launcher."""
    chp = repo / "node_modules" / ".bin" / "configurable-http-proxy"
    names = keep_names(env)
    keep = [f"--keep={','.join(names)}"] if names else []
    return [*LAUNCHER, *keep, "--", str(chp) if chp.exists() else "configurable-http-proxy"]


def forget_stale_pid_file(pid_file: Path) -> bool:
    """Remove the proxy's pid file if the process it names is not a configurable-http-proxy.

    JupyterHub kills the process a leftover pid file names before it starts
    its proxy, and refuses to start when that fails. The file lives in the
    data dir, which outlives processes: after a reboot, or in a recreated hub
    container (``docker compose up`` after an upgrade: the data volume stays,
    pids start again from 1), the pid belongs to some other process. Returns
    whether the file was removed.
    """
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        running = b"configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        running = False
    if running:
        return False
    pid_file.unlink(missing_ok=True)
    return True


def parse(argv: list[str]) -> tuple[frozenset[str], list[str]]:
    """``[--keep=NAMES] -- CMD...`` -> (the extra names, CMD)."""
    if "--" not in argv:
        raise SystemExit(USAGE)
    at = argv.index("--")
    options, command = argv[:at], argv[at + 1 :]
    extra: set[str] = set()
    for option in options:
        names = option.removeprefix("--keep=").split(",") if option.startswith("--keep=") else []
        if not names or not all(_NAME.match(name) for name in names):
            raise SystemExit(f"proxy_env: unknown option {option!r}\n{USAGE}")
        extra.update(names)
    if not command:
        raise SystemExit(USAGE)
    return frozenset(extra), command


def main(argv: list[str] | None = None) -> None:
    extra, command = parse(sys.argv[1:] if argv is None else argv)
    environment = proxy_environment(os.environ, extra)
    try:
        os.execvpe(command[0], command, environment)
    except OSError as exc:
        raise SystemExit(
            f"proxy_env: cannot run {command[0]}: {exc.strerror} (run `npm install` in the checkout, "
            "or put configurable-http-proxy and node on the hub's PATH)"
        ) from None


if __name__ == "__main__":
    main()
