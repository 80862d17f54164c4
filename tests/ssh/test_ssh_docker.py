"""SSH, scp, rsync, sftp and ``ssh -L`` into a user's own container, through the hub.

Real hub, configurable-http-proxy, Docker engine, Debian's OpenSSH client and
websocat, with the ``~/.ssh/config`` entry the SSH page gives. One hub and two
containers are shared by the whole package (tests/ssh/conftest.py), so the
tests run in file order and leave the servers running.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime

import pytest
import requests

from tests.conftest import free_port
from tests.docker.conftest import docker

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.integration]


def container_env(name: str) -> dict[str, str]:
    out = docker("exec", name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_ssh_runs_in_the_users_container_with_exactly_its_gpus(ssh_hub, alice):
    r = ssh_hub.run("ssh", alice.name, "HOST", "printenv WORKBENCH_GPUS")
    assert r.returncode == 0, r.stderr
    leased = ssh_hub.hub.leases()[alice.name]
    assert len(leased) == 2
    assert r.stdout.strip().split(",") == container_env(ssh_hub.container(alice.name))["WORKBENCH_GPUS"].split(",")
    assert sorted(r.stdout.strip().split(",")) == sorted(leased)

    r = ssh_hub.run("ssh", alice.name, "HOST", "id -u; echo $HOME; printenv NVIDIA_VISIBLE_DEVICES; env")
    uid, home, nvidia, *env_lines = r.stdout.splitlines()
    assert (uid, home) == ("1000", "/home/jovyan")
    assert sorted(nvidia.split(",")) == sorted(leased)
    session_env = dict(line.split("=", 1) for line in env_lines if "=" in line)
    # nothing of the server's secrets: the hub token never reaches an SSH session
    assert not {k for k in session_env if k.startswith("JUPYTERHUB_")}


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
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(first.read_bytes()).hexdigest()
    assert r.stdout.endswith("rsync through the hub\n")


def test_sftp_lists_the_home(ssh_hub, alice):
    r = ssh_hub.run("sftp", alice.name, "-b", "-", "HOST", input="pwd\nls -1\n")
    assert r.returncode == 0, r.stderr
    assert "/home/jovyan" in r.stdout and "via-scp.bin" in r.stdout and "notebooks" in r.stdout


def test_ssh_L_forwards_a_port_to_a_process_in_the_container(ssh_hub, alice):
    container = ssh_hub.container(alice.name)
    docker("exec", container, "sh", "-c", "mkdir -p /tmp/www && echo served-from-container > /tmp/www/hello.txt")
    docker("exec", "-d", container, "python3", "-m", "http.server", "8765", "--bind", "127.0.0.1",
           "--directory", "/tmp/www")
    local = free_port()
    cfg, alias = ssh_hub.config(alice.name)
    tunnel = subprocess.Popen(["ssh", "-F", str(cfg), "-N", "-o", "ExitOnForwardFailure=yes",
                               "-L", f"127.0.0.1:{local}:127.0.0.1:8765", alias],
                              env=ssh_hub.env(alice.token), stderr=subprocess.PIPE, text=True)
    try:
        deadline, body = time.monotonic() + 30, None
        while time.monotonic() < deadline and body is None:
            try:
                body = requests.get(f"http://127.0.0.1:{local}/hello.txt", timeout=5).text
            except requests.ConnectionError:
                assert tunnel.poll() is None, tunnel.stderr.read()
                time.sleep(0.5)
        assert body == "served-from-container\n"
    finally:
        tunnel.terminate()
        tunnel.wait(10)


def test_a_live_ssh_session_counts_as_server_activity(ssh_hub, alice):
    """Bytes through jupyter-server-proxy's websocket are recorded as the server's activity."""

    def last_activity() -> datetime:
        server = ssh_hub.hub.api("GET", f"/users/{alice.name}").json()["servers"][""]
        return datetime.fromisoformat(server["last_activity"].replace("Z", "+00:00"))

    started = datetime.now().astimezone()
    # a quiet session: one command that sleeps, only ssh keepalives move meanwhile
    r = ssh_hub.run("ssh", alice.name, "-o", "ServerAliveInterval=1", "HOST", "sleep 12; echo done", timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    time.sleep(5)  # two activity reports
    assert (last_activity() - started).total_seconds() >= 9


def test_a_cpu_only_session_has_an_empty_allocation_and_no_other_users_files(ssh_hub, alice, bob):
    marker = f"bob-only-{bob.name}"
    assert ssh_hub.run("ssh", bob.name, "HOST", f"echo secret > {marker}").returncode == 0
    r = ssh_hub.run("ssh", alice.name, "HOST", f"ls -a ~ /home; test ! -e ~/{marker}; echo absent")
    assert r.returncode == 0 and r.stdout.strip().endswith("absent"), r.stderr
    assert marker not in r.stdout
    r = ssh_hub.run("ssh", bob.name, "HOST", "printenv WORKBENCH_GPUS")
    assert r.stdout.strip() == ",".join(ssh_hub.hub.leases()[bob.name])


def test_the_documented_file_token_works(ssh_hub, alice):
    (ssh_hub.workdir / ".ssh").mkdir(exist_ok=True)
    token_file = ssh_hub.workdir / ".ssh" / "workbench-token"
    token_file.write_text(alice.token + "\n")
    token_file.chmod(0o600)
    cfg, alias = ssh_hub.config(alice.name, token_source="file")
    r = subprocess.run(["ssh", "-F", str(cfg), alias, "echo via-file"], capture_output=True, text=True, timeout=60,
                       env=ssh_hub.env(None))
    assert r.returncode == 0 and r.stdout == "via-file\n", r.stderr


SSHD_PROCESSES = r"""for p in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null) || continue
  case "$c" in sshd:*-D*|*/sshd\ *-D*) echo "$(awk '/^Uid:/{print $2}' $p/status) $c";; esac
done"""


def test_sshd_in_the_container_runs_as_the_user_with_key_only_rules(ssh_hub, alice):
    container = ssh_hub.container(alice.name)
    lines = docker("exec", container, "sh", "-c", SSHD_PROCESSES).stdout.splitlines()
    daemons = [line for line in lines if "-f none" in line]
    assert len(daemons) == 1 and all(line.split()[0] == "1000" for line in lines), lines
    for option in ("PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin no",
                   "AuthenticationMethods publickey", "AllowUsers jovyan", "ListenAddress 127.0.0.1:"):
        assert option in daemons[0], daemons[0]
    listen = docker("exec", container, "sh", "-c", "cat /proc/net/tcp /proc/net/tcp6").stdout
    assert ":0016 " not in listen  # the image's own sshd service does not run: nothing on port 22
    home_ssh = docker("exec", container, "ls", "/home/jovyan/.ssh/").stdout.split()
    assert "jupyter_sshd_hostkey" in home_ssh and "authorized_keys" in home_ssh
