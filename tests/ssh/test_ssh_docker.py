"""SSH, scp, rsync, sftp, ``ssh -L`` and ``-D`` into a user's own container, through the hub.

Real hub, configurable-http-proxy, Docker engine and Debian's OpenSSH client,
with the ``~/.ssh/config`` entry the SSH page gives and the ProxyCommand file it
serves. One hub and two containers are shared by the whole package
(tests/ssh/conftest.py), so the tests run in file order and leave the servers
running.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from datetime import datetime

import pytest
import requests

from tests.conftest import free_port, missing
from tests.docker.conftest import container_env, docker, inspect

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.integration]


def server_last_activity(ssh_hub, account) -> datetime:
    """The server's last_activity as the hub's API (and so the idle culler) sees it."""
    server = ssh_hub.hub.api("GET", f"/users/{account.name}").json()["servers"][""]
    return datetime.fromisoformat(server["last_activity"].replace("Z", "+00:00"))


#: all a command session's environment may hold: sshd's own variables, the server's GPU variables,
#: PATH and HOME (sshd's SetEnv), and what bash adds itself. Never the server's hub token, its
#: JUPYTERHUB_* settings or anything else of the server's.
SESSION_ALLOWLIST = {
    "USER",
    "LOGNAME",
    "HOME",
    "SHELL",
    "MAIL",
    "SSH_CLIENT",
    "SSH_CONNECTION",
    "PATH",
    "WORKBENCH_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "PWD",
    "SHLVL",
    "_",
}
FROM_THE_SERVER = ("PATH", "WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES")
VENV_PYTHON = "/opt/workbench/venv/bin/python"


def session_env(output: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in output.split("\0") if "=" in item)


def test_ssh_runs_in_the_users_container_with_exactly_its_gpus(ssh_hub, alice):
    r = ssh_hub.run("ssh", alice.name, "HOST", "printenv WORKBENCH_GPUS")
    assert r.returncode == 0, r.stderr
    leased = ssh_hub.hub.leases()[alice.name]
    assert len(leased) == 2
    assert r.stdout.strip().split(",") == container_env(ssh_hub.container(alice.name))["WORKBENCH_GPUS"].split(",")
    assert sorted(r.stdout.strip().split(",")) == sorted(leased)


def test_a_session_has_the_servers_world_and_nothing_more(ssh_hub, alice):
    server = container_env(ssh_hub.container(alice.name))
    r = ssh_hub.run("ssh", alice.name, "HOST", "id -u; pwd; env -0")
    assert r.returncode == 0, r.stderr
    uid, cwd, env_text = r.stdout.split("\n", 2)
    env = session_env(env_text)
    assert set(env) <= SESSION_ALLOWLIST, sorted(set(env) - SESSION_ALLOWLIST)
    assert (uid, cwd, env["HOME"], env["USER"]) == ("1000", "/home/jovyan", server["HOME"], "jovyan")
    for name in FROM_THE_SERVER:
        assert env.get(name) == server.get(name), name
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(ssh_hub.hub.leases()[alice.name])
    assert env["PATH"].split(":")[0] == "/opt/workbench/venv/bin"


def test_a_login_shell_keeps_the_servers_python_and_gpus(ssh_hub, alice):
    """Debian's /etc/profile sets a fixed PATH for login shells; the image's profile.d puts the venv back."""
    gpus = container_env(ssh_hub.container(alice.name))["WORKBENCH_GPUS"]
    r = ssh_hub.run("ssh", alice.name, "HOST", "bash -lc 'command -v python; printenv WORKBENCH_GPUS'")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [VENV_PYTHON, gpus]
    # an interactive session (a terminal, as a person or VS Code's terminal gets it) is a login shell too
    r = ssh_hub.run("ssh", alice.name, "-tt", "HOST", input='echo "seen:$(command -v python):$(pwd)"; exit\n')
    assert f"seen:{VENV_PYTHON}:/home/jovyan" in r.stdout, (r.stdout, r.stderr)


def test_scp_and_rsync_copy_into_the_home_and_the_files_survive_a_restart(ssh_hub, alice, tmp_path):
    first, second = tmp_path / "via-scp.bin", tmp_path / "via-rsync.txt"
    first.write_bytes(os.urandom(256 * 1024))
    second.write_text("rsync through the hub\n")
    r = ssh_hub.run("scp", alice.name, "-q", str(first), "HOST:")
    assert r.returncode == 0, r.stderr
    r = ssh_hub.run("rsync", alice.name, "-a", str(second), "HOST:notes/")
    assert r.returncode == 0, r.stderr

    ssh_hub.restart(alice.name)

    r = ssh_hub.run("ssh", alice.name, "HOST", "sha256sum via-scp.bin; cat notes/via-rsync.txt")
    assert r.returncode == 0, r.stderr  # also: the host key is the same (StrictHostKeyChecking on a known host)
    assert r.stdout.split()[0] == hashlib.sha256(first.read_bytes()).hexdigest()
    assert r.stdout.endswith("rsync through the hub\n")


def test_sftp_lists_the_home(ssh_hub, alice):
    r = ssh_hub.run("sftp", alice.name, "-b", "-", "HOST", input="pwd\nls -1\n")
    assert r.returncode == 0, r.stderr
    assert "/home/jovyan" in r.stdout
    assert "via-scp.bin" in r.stdout
    assert "notebooks" in r.stdout


def test_ssh_local_and_dynamic_forwarding_reach_a_process_in_the_container(ssh_hub, alice):
    """Local (-L) and dynamic (-D, SOCKS) forwarding stay on: VS Code Remote-SSH tunnels through them."""
    if shutil.which("curl") is None:
        missing("curl is not installed (apt-get install curl)")
    container = ssh_hub.container(alice.name)
    docker("exec", container, "sh", "-c", "mkdir -p /tmp/www && echo served-from-container > /tmp/www/hello.txt")
    docker(
        "exec",
        "-d",
        container,
        "python3",
        "-m",
        "http.server",
        "8765",
        "--bind",
        "127.0.0.1",
        "--directory",
        "/tmp/www",
    )
    local, socks = free_port(), free_port()
    cfg, alias = ssh_hub.config(alice.name)
    tunnel = subprocess.Popen(
        [
            "ssh",
            "-F",
            str(cfg),
            "-N",
            "-o",
            "ExitOnForwardFailure=yes",
            "-L",
            f"127.0.0.1:{local}:127.0.0.1:8765",
            "-D",
            f"127.0.0.1:{socks}",
            alias,
        ],
        env=ssh_hub.env(alice.token),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, body = time.monotonic() + 30, None
        while time.monotonic() < deadline and body is None:
            try:
                body = requests.get(f"http://127.0.0.1:{local}/hello.txt", timeout=5).text
            except requests.ConnectionError:
                assert tunnel.poll() is None, tunnel.stderr.read()
                time.sleep(0.5)
        assert body == "served-from-container\n"
        via_socks = subprocess.run(
            [
                "curl",
                "-sS",
                "--max-time",
                "20",
                "--socks5-hostname",
                f"127.0.0.1:{socks}",
                "http://127.0.0.1:8765/hello.txt",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert via_socks.stdout == "served-from-container\n", via_socks.stderr
    finally:
        tunnel.terminate()
        tunnel.wait(10)


def test_remote_agent_and_x11_forwarding_are_refused(ssh_hub, alice):
    r = ssh_hub.run(
        "ssh",
        alice.name,
        "-o",
        "ExitOnForwardFailure=yes",
        "-R",
        f"127.0.0.1:{free_port()}:127.0.0.1:22",
        "HOST",
        "echo reached",
    )
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "remote port forwarding failed" in r.stderr, (r.stdout, r.stderr)
    r = ssh_hub.run(
        "ssh",
        alice.name,
        "-A",
        "-X",
        "HOST",
        "echo agent=${SSH_AUTH_SOCK:-none} display=${DISPLAY:-none}",
        env_extra={"SSH_AUTH_SOCK": str(ssh_hub.workdir / "agent.sock"), "DISPLAY": ":0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "agent=none display=none\n", r.stderr


def test_an_open_silent_ssh_session_keeps_the_server_active(ssh_hub, alice):
    """A session that prints nothing still moves ssh's keepalives through jupyter-server-proxy's
    websocket, which records them as the server's activity; once it closes, activity stops.

    The documented config sends a keepalive after 30 s of silence (ServerAliveInterval 30); this
    test asks for one every 2 s, and the hub reads activity every 2 s (tests/ssh/conftest.py)."""
    with ssh_hub.silent_session(alice.name, alice.token, 29) as session:  # silent: no output moves the clock
        time.sleep(5)  # the handshake's activity has been reported
        start = server_last_activity(ssh_hub, alice)
        time.sleep(10)
        during = server_last_activity(ssh_hub, alice)
        assert session.poll() is None, session.stderr.read()  # still open...
        assert (during - start).total_seconds() >= 5, (start, during)  # ...and it counted as activity
    time.sleep(5)  # the close is reported
    closed = server_last_activity(ssh_hub, alice)
    time.sleep(8)
    assert server_last_activity(ssh_hub, alice) == closed  # nothing else keeps it moving


def test_a_cpu_only_session_has_an_empty_allocation_and_no_other_users_files(ssh_hub, alice, bob):
    assert bob.gpus == 0
    assert bob.name not in ssh_hub.hub.leases()
    server = container_env(ssh_hub.container(bob.name))
    assert server["WORKBENCH_GPUS"] == ""
    assert server.get("NVIDIA_VISIBLE_DEVICES") in (None, "void")
    r = ssh_hub.run("ssh", bob.name, "HOST", "env -0")
    assert r.returncode == 0, r.stderr
    env = session_env(r.stdout)
    assert env["WORKBENCH_GPUS"] == ""  # set, and empty: this server has no GPU
    for name in FROM_THE_SERVER:
        assert env.get(name) == server.get(name), name

    marker = f"bob-only-{bob.name}"
    assert ssh_hub.run("ssh", bob.name, "HOST", f"echo secret > {marker}").returncode == 0
    r = ssh_hub.run("ssh", alice.name, "HOST", f"ls -a ~ /home; test ! -e ~/{marker}; echo absent")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("absent"), r.stderr
    assert marker not in r.stdout


def test_the_documented_file_token_works(ssh_hub, alice):
    (ssh_hub.workdir / ".ssh").mkdir(exist_ok=True)
    token_file = ssh_hub.workdir / ".ssh" / "workbench-token"
    token_file.write_text(alice.token + "\n")
    token_file.chmod(0o600)
    cfg, alias = ssh_hub.config(alice.name, token_source="file")
    r = subprocess.run(
        ["ssh", "-F", str(cfg), alias, "echo via-file"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ssh_hub.env(None),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "via-file\n", r.stderr


SSHD_PROCESSES = r"""for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null) || continue
  case "$c" in sshd:*-D*|*/sshd\ *-D*) echo "$(awk '/^Uid:/{print $2}' $p/status) $c";; esac
done"""


def test_sshd_in_the_container_runs_as_the_user_with_key_only_rules(ssh_hub, alice):
    container = ssh_hub.container(alice.name)
    lines = docker("exec", container, "sh", "-c", SSHD_PROCESSES).stdout.splitlines()
    daemons = [line for line in lines if "-f none" in line]
    assert len(daemons) == 1, lines
    assert all(line.split()[0] == "1000" for line in lines), lines
    for option in (
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "AuthenticationMethods publickey",
        "AllowUsers jovyan",
        "ListenAddress 127.0.0.1:",
        "AllowTcpForwarding local",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        # forwards: the container's own loopback, and the shared hub's WORKBENCH_SSH_PERMIT_OPEN (conftest.py)
        "PermitOpen localhost:* 127.0.0.1:* [::1]:* 127.0.0.2:6006 ",
        "ForceCommand /bin/sh ",
    ):
        assert option in daemons[0], daemons[0]
    listen = docker("exec", container, "sh", "-c", "cat /proc/net/tcp /proc/net/tcp6").stdout
    assert ":0016 " not in listen  # the image's own sshd service does not run: nothing on port 22
    home_ssh = docker("exec", container, "ls", "/home/jovyan/.ssh/").stdout.split()
    assert "jupyter_sshd_hostkey" in home_ssh
    assert "authorized_keys" in home_ssh


def test_ssh_publishes_no_port_on_the_host(ssh_hub, alice, bob):
    """SSH rides on the hub's one port. The hub and its proxy reach each container by its address on
    the users' isolated network (docs/network-isolation.md), so no container publishes any port on the
    host: neither its server (8888) nor sshd (on a loopback port inside the container)."""
    for account in (alice, bob):
        container = ssh_hub.container(account.name)
        assert docker("port", container).stdout.strip() == "", container
        assert not inspect(container)["HostConfig"]["PortBindings"], container
