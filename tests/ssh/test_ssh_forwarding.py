"""``ssh -L`` through the hub reaches the student's own server, and by default nothing else.

The shared hub (tests/ssh/conftest.py) runs with ``WORKBENCH_SSH_PERMIT_OPEN=127.0.0.2:6006``, an
operator's extra entry. In alice's container a server listens on every interface (``0.0.0.0:6006``,
as a student's TensorBoard would); one ssh process opens four local forwards through the hub:

* ``localhost:6006``, her own server: an HTTP GET through it answers 200;
* ``127.0.0.2:6006``, the operator's entry (the same server, by an address only that entry allows): 200;
* the hub's internal API (``JUPYTERHUB_API_URL``'s host and port, which the container itself reaches)
  and bob's server (his container's address, port 8888): sshd refuses the channel, the client writes
  ``channel N: open failed: administratively prohibited`` and closes the forwarded connection at once
  without a byte, and the session stays up for the forwards that are allowed.
"""

from __future__ import annotations

import socket
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from tests.conftest import free_port, wait_until
from tests.docker.conftest import container_env, docker, inspect

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.integration]

#: the operator's entry the shared hub is started with (tests/ssh/conftest.py)
OPERATOR_ENTRY = "127.0.0.2:6006"
PROHIBITED = "open failed: administratively prohibited"
REQUEST = b"GET / HTTP/1.0\r\n\r\n"


def through(port: int) -> bytes:
    """What an HTTP GET through the laptop's end of a forward gets back before the connection closes."""
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(REQUEST)
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def answers_200(port: int, tunnel: subprocess.Popen, stderr) -> bool:
    assert tunnel.poll() is None, stderr.read_text()
    try:
        return through(port).startswith(b"HTTP/1.0 200 ")
    except ConnectionRefusedError:  # ssh is not listening yet
        return False


def container_address(container: str) -> str:
    networks = inspect(container)["NetworkSettings"]["Networks"]
    return next(n["IPAddress"] for n in networks.values() if n.get("IPAddress"))


def test_forwards_reach_the_own_server_and_what_the_operator_adds_but_not_the_hub_or_others(
    ssh_hub, alice, bob, tmp_path
):
    container = ssh_hub.container(alice.name)
    docker("exec", "-d", "--user", "1000", container, "python3", "-m", "http.server", "6006", "--bind", "0.0.0.0")
    api_url = container_env(container)["JUPYTERHUB_API_URL"]
    api = urlsplit(api_url)
    # the container itself reaches the hub's API (it must): the refusal below is sshd's rule, not the network
    docker("exec", container, "python3", "-c", f"import urllib.request as u; u.urlopen({api_url!r}, timeout=5)")
    destinations = {
        "own": "localhost:6006",
        "operator": OPERATOR_ENTRY,
        "hub_api": f"{api.hostname}:{api.port}",
        "bob": f"{container_address(ssh_hub.container(bob.name))}:8888",
    }
    local = {name: free_port() for name in destinations}
    cfg, alias = ssh_hub.config(alice.name)
    forwards = [a for name, dest in destinations.items() for a in ("-L", f"127.0.0.1:{local[name]}:{dest}")]
    stderr = tmp_path / "ssh.stderr"
    with stderr.open("w") as err:
        tunnel = subprocess.Popen(
            ["ssh", "-F", str(cfg), "-N", "-o", "ExitOnForwardFailure=yes", *forwards, alias],
            env=ssh_hub.env(alice.token),
            stderr=err,
            text=True,
        )
    try:
        wait_until(lambda: answers_200(local["own"], tunnel, stderr), 30, "a GET through -L localhost:6006")

        for name in ("hub_api", "bob"):
            seen = stderr.read_text().count(PROHIBITED)
            started = time.monotonic()
            assert through(local[name]) == b"", name  # closed without an answer...
            assert time.monotonic() - started < 5, name  # ...at once
            wait_until(lambda n=seen + 1: stderr.read_text().count(PROHIBITED) == n, 5, f"sshd refusing {name}")

        # the session is still up, and the operator's entry is open too
        assert answers_200(local["operator"], tunnel, stderr)
        assert answers_200(local["own"], tunnel, stderr)
        assert stderr.read_text().count(PROHIBITED) == 2, stderr.read_text()
    finally:
        tunnel.terminate()
        tunnel.wait(10)
