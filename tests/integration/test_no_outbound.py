"""The single-user server starts without reaching past loopback: no package registry, no news, no update check.

At a class start (200 servers at once on a loaded host) JupyterLab's own calls out crashed some servers
("KeyError: 'registry'" from its ``jlpm config`` call) and made every one wait on the network: the npm
registry look-up (``node .../yarn.js config --json``, when JupyterLab is imported and for each listing of
the installed extensions), the extension manager's PyPI look-ups, the news feed, the update check.
images/singleuser/jupyter_server_config.py turns them off; ``make install`` puts it in .venv's sys-prefix
config dir, the single-user image in its own venv's.

The real hub with the local backend starts the real ``jupyterhub-singleuser`` of .venv, as ``make run``
does; the only change is ``strace -f -e trace=connect,execve`` in front of the command (a local config
file). Hub, proxy and server all run in a network namespace with only ``lo`` up: a connect() to anything
else fails there at once (ENETUNREACH) instead of waiting, and the strace log shows where it went.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, hub_pool, missing, wait_until

pytestmark = [pytest.mark.integration]

CLONE_NEWNET = 0x40000000
SERVER_CONFIG = REPO / "images" / "singleuser" / "jupyter_server_config.py"
INSTALLED_CONFIG = REPO / ".venv" / "etc" / "jupyter" / "jupyter_server_config.py"
# What the server's log must not say: the yarn/npm registry look-up (KeyError: 'registry'), a connect that
# found no route, a DNS look-up that found no server.
BAD_LOG = re.compile(r"registry|Network is unreachable|name resolution|Name or service not known", re.IGNORECASE)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def no_route():
    """This thread in a new network namespace with only ``lo`` up; what it starts is born there.

    ``unshare --net`` makes the namespace (a ``sleep`` holds it); setns(2) moves only the calling thread
    (the test's), so the hub it starts, the proxy and the servers live there and the test reaches them
    on the namespace's loopback. The thread goes back to its own namespace afterwards."""
    if os.geteuid() != 0:
        missing("a network namespace needs root (unshare --net)")
    for tool in ("unshare", "strace", "ip"):
        if not shutil.which(tool):
            missing(f"{tool} is not installed (apt-get install strace util-linux iproute2)")
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep 600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if holder.stdout.readline().strip() != "up":
            missing(f"unshare --net with lo up failed here (exit {holder.wait()}): no network namespaces")
        theirs = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY)
        try:
            _setns(theirs)
        finally:
            os.close(theirs)
        try:
            links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
            assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"], links
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
        holder.kill()
        holder.wait()


def outbound_connects(trace: str) -> list[str]:
    """The connect() calls in an strace log that went anywhere but loopback or a Unix socket."""
    found = []
    for line in trace.splitlines():
        if "connect(" not in line or "resumed>" in line:
            continue
        family = re.search(r"sa_family=(AF_\w+)", line)
        if family is None:
            found.append(line)
            continue
        if family[1] in ("AF_UNIX", "AF_UNSPEC"):  # AF_UNSPEC: a socket's association undone, no peer
            continue
        if family[1] == "AF_INET":
            address = re.search(r'inet_addr\("([^"]+)"\)', line)
        elif family[1] == "AF_INET6":
            address = re.search(r'inet_pton\(AF_INET6, "([^"]+)"', line)
        else:
            address = None
        if address is None:
            found.append(line)
            continue
        ip = ipaddress.ip_address(address[1])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if not ip.is_loopback:
            found.append(line)
    return found


@pytest.fixture
def hub_without_route(tmp_path):
    """running_hub's factory, the hub (and so its proxy and servers) in a namespace with only ``lo``."""
    with no_route(), hub_pool(tmp_path) as start:
        yield start


def yarn_runs(trace: str) -> list[str]:
    """The execve() calls in an strace log that ran jlpm/yarn (``node .../yarn.js config --json``).

    jupyter-lsp's ``npm prefix -g`` (where node language servers may be installed) reads npm's own
    settings and connects nowhere; outbound_connects would see it if it did."""
    return [line for line in trace.splitlines() if "execve(" in line and re.search(r"yarn|jlpm", line)]


def test_the_server_starts_without_connecting_past_loopback(hub_without_route, tmp_path):
    trace = tmp_path / "server.strace"
    local_config = tmp_path / "jupyterhub_config.local.py"
    # -I1: the hub's stop (SIGINT) ends strace at once; the server it leaves goes with the fixture's clean-up.
    strace = [shutil.which("strace"), "-f", "-qq", "-I1", "-s", "256", "-e", "trace=connect,execve", "-o", str(trace)]
    command = [*strace, str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    local_config.write_text(f"c.Spawner.cmd = {command!r}\n")
    hub = hub_without_route({"WORKBENCH_LOCAL_CONFIG": str(local_config)})
    log_start = len(hub.log())

    started = time.monotonic()
    hub.create_users("ada")
    assert hub.spawn("ada", gpus=0).status_code in (201, 202)
    hub.wait_ready("ada", timeout=60)
    auth = {"Authorization": f"token {hub.user_token('ada')}"}
    base = f"{hub.url}/user/ada"
    wait_until(lambda: requests.get(f"{base}/api", timeout=5).ok, 20, "the server's /api answers")
    # What JupyterLab's page asks for in its first seconds: the page, the installed extensions (the
    # extension manager's panel, when a user left it open), the update check and the news feed.
    for path in ("lab", "lab/api/extensions?refresh=0", "lab/api/update", "lab/api/news"):
        r = requests.get(f"{base}/{path}", headers=auth, timeout=30)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:300]}"
        if path.startswith("lab/api/extensions"):
            installed = {extension["name"] for extension in r.json() if extension["installed"]}
    time.sleep(4)  # what the server does on its own shortly after start (jupyter-lsp's look-around, say)
    print(f"server started and asked in {time.monotonic() - started:.1f} s")

    hint = f" (is {SERVER_CONFIG.relative_to(REPO)} installed as {INSTALLED_CONFIG.relative_to(REPO)}? make install)"
    calls = trace.read_text(errors="replace")
    assert "connect(" in calls, "strace saw no connect() at all: not the server's trace?"
    outbound = outbound_connects(calls)
    assert not outbound, "the server tried to connect past loopback" + hint + ":\n" + "\n".join(outbound[:20])
    yarn = yarn_runs(calls)
    assert not yarn, "the server ran jlpm/yarn" + hint + ":\n" + "\n".join(yarn[:10])
    bad = [line for line in hub.log()[log_start:].splitlines() if BAD_LOG.search(line)]
    assert not bad, "the server's log" + hint + ":\n" + "\n".join(bad[:20])
    # Users still see what is installed (the read-only manager lists it, the GPU monitor among it).
    assert any("gpu" in name and "monitor" in name for name in installed), installed
