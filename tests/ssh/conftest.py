"""One hub (docker backend, real proxy) with two users' servers, shared by every SSH test.

alice has 2 simulated GPUs and her key in authorized_keys; bob has a CPU-only
server (0 GPUs) and his own key. Both get a token scoped to their own server only
(``access:servers!server=<user>/``), the least privilege the SSH page suggests.
The hub lets forwards reach one destination beyond the servers' own loopback
(``WORKBENCH_SSH_PERMIT_OPEN=127.0.0.2:6006``), as an operator may.
The laptop side is Debian's OpenSSH client with the ``~/.ssh/config`` entry the
SSH page gives, and the ProxyCommand file the page serves, saved where the page
says (``~/.ssh/workbench-ssh-proxy.py``, HOME being the test's laptop directory)
and run by the test venv's python3 (which has websocket-client).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import hub_pool, missing, wait_until

# `x as x`: the Docker tier's fixtures, re-exported by name for pytest.
from tests.docker.conftest import base_image as base_image
from tests.docker.conftest import docker, remove_user_objects
from tests.docker.conftest import docker_engine as docker_engine
from tests.docker.conftest import singleuser_image as singleuser_image
from tests.docker.conftest import wheelhouse as wheelhouse

CLIENT_TOOLS = ("ssh", "scp", "sftp", "rsync", "ssh-keygen")
#: every process's command line in a container, one a line
PROCESSES = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def client_path() -> str:
    """The laptop's PATH: this venv's python3 (with websocket-client) first."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.fixture(scope="session")
def ssh_client_tools() -> str:
    """PATH with Debian's OpenSSH client, rsync and a python3 that has websocket-client; missing() otherwise."""
    path = client_path()
    for tool in CLIENT_TOOLS:
        if shutil.which(tool, path=path) is None:
            missing(f"{tool} is not installed (apt-get install openssh-client rsync)")
    python3 = shutil.which("python3", path=path)
    if python3 is None or subprocess.run([python3, "-c", "import websocket"], capture_output=True).returncode:
        missing("the laptop side needs python3 with websocket-client (pip install websocket-client)")
    return path


@dataclass
class Account:
    name: str
    token: str
    token_id: str
    key: Path
    gpus: int
    extra_tokens: list[str] = field(default_factory=list)


class SSHHub:
    """The shared hub plus the helpers every SSH test uses."""

    def __init__(self, hub, workdir: Path, path: str):
        self.hub = hub
        self.workdir = workdir
        self.path = path
        self.accounts: dict[str, Account] = {}

    def server_api(self, user: str, method: str, route: str, token: str | None = None, **kwargs) -> requests.Response:
        token = token or self.accounts[user].token
        return requests.request(
            method,
            f"{self.hub.url}/user/{user}/api/workbench/ssh{route}",
            headers={"Authorization": f"token {token}"},
            timeout=30,
            **kwargs,
        )

    def enroll(self, user: str, gpus: int) -> Account:
        """What a user does once: a token scoped to their server, a key pair, the public key added on
        the SSH page (201)."""
        token, token_id = scoped_token(self.hub, user)
        account = self.accounts[user] = Account(user, token, token_id, self.keygen(user), gpus)
        r = self.server_api(user, "POST", "/keys", json={"key": (self.workdir / f"id_{user}.pub").read_text()})
        assert r.status_code == 201, r.text
        return account

    def container(self, user: str) -> str:
        return self.hub.server(user)["state"]["object_name"]

    def keygen(self, name: str) -> Path:
        key = self.workdir / f"id_{name}"
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", str(key)], check=True
            )
        return key

    def install_proxy(self, user: str, info: dict) -> Path:
        """Save the ProxyCommand file the page links where the page says, under this laptop's HOME."""
        assert info["proxy_script"].startswith("~/")
        path = self.workdir / info["proxy_script"][2:]
        if not path.exists():
            r = requests.get(
                f"{self.hub.url}{info['proxy_script_url']}",
                timeout=30,
                headers={"Authorization": f"token {self.accounts[user].token}"},
            )
            assert r.status_code == 200, r.text[:300]
            assert r.text.startswith("#!/usr/bin/env python3"), r.text[:300]
            path.parent.mkdir(mode=0o700, exist_ok=True)
            path.write_text(r.text)
        return path

    def config(
        self, user: str, identity: Path | None = None, token_source: str = "env", entry: str | None = None
    ) -> tuple[Path, str]:
        """The page's ``~/.ssh/config`` entry for ``user`` (identity and known_hosts made local to the test).

        ``entry`` is the entry as the page showed it; by default it comes from the page's API, and the
        ProxyCommand file the page links is saved where the entry expects it."""
        if entry is None:
            info = self.server_api(user, "GET", "").json()
            self.install_proxy(user, info)
            entry = info["ssh_config_env" if token_source == "env" else "ssh_config"]
        text = entry
        alias = text.splitlines()[0].split()[1]  # Host <alias>
        identity = identity or self.accounts[user].key
        lines = [
            f"    IdentityFile {identity}" if line.strip().startswith("IdentityFile") else line
            for line in text.splitlines()
        ]
        lines.insert(1, f"    UserKnownHostsFile {self.workdir / 'known_hosts'}")
        lines.insert(1, "    StrictHostKeyChecking accept-new")
        lines.insert(1, "    BatchMode yes")
        lines.insert(1, "    ConnectTimeout 20")
        path = self.workdir / f"config-{user}-{uuid.uuid4().hex[:6]}"
        path.write_text("\n".join(lines) + "\n")
        return path, alias

    def env(self, token: str | None) -> dict[str, str]:
        """The laptop's environment: HOME is the test's directory, the token (if any) in WORKBENCH_HUB_TOKEN."""
        env = {**os.environ, "PATH": self.path, "HOME": str(self.workdir)}
        env.pop("WORKBENCH_HUB_TOKEN", None)
        if token is not None:
            env["WORKBENCH_HUB_TOKEN"] = token
        return env

    def run(
        self,
        tool: str,
        user: str,
        *args: str,
        token: str | None = "own",
        identity: Path | None = None,
        timeout: float = 60,
        input: str | None = None,
        login: str | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """``ssh``/``scp``/``sftp``/``rsync`` through the hub with the documented config.

        ``args`` may use ``HOST`` for the alias (``HOST:path`` for scp and rsync)."""
        cfg, alias = self.config(user, identity)
        target = f"{login}@{alias}" if login else alias
        args = tuple(a.replace("HOST", target) for a in args)
        argv = ["rsync", "-e", f"ssh -F {cfg}", *args] if tool == "rsync" else [tool, "-F", str(cfg), *args]
        token = self.accounts[user].token if token == "own" else token
        env = {**self.env(token), **(env_extra or {})}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, input=input)

    @contextmanager
    def silent_session(self, user: str, token: str, seconds: int):
        """An open SSH session that prints nothing (``exec sleep SECONDS``), with a keepalive every 2 s
        (the documented config: after 30 s of silence); yields the ssh process once its command runs in
        the container (``docker exec`` is not server activity). On leaving it is closed, and must have
        printed nothing: only keepalives moved."""
        cfg, alias = self.config(user)  # a server API call: activity now, before the session
        container = self.container(user)
        argv = ["ssh", "-F", str(cfg), "-o", "ServerAliveInterval=2", alias, f"exec sleep {seconds}"]
        session = subprocess.Popen(argv, env=self.env(token), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_until(
                lambda: f"sleep {seconds}" in docker("exec", container, "sh", "-c", PROCESSES).stdout,
                30,
                "the SSH session's command running in the container",
            )
            yield session
        finally:
            session.terminate()
            out, _ = session.communicate(timeout=10)
        assert out == ""  # a silent session

    def restart(self, user: str) -> None:
        r = self.hub.api("DELETE", f"/users/{user}/server")
        assert r.status_code in (202, 204), r.text
        self.hub.wait_stopped(user, timeout=120)
        r = self.hub.spawn(user, gpus=self.accounts[user].gpus)
        assert r.status_code in (201, 202), r.text
        self.hub.wait_ready(user, timeout=180)


def scoped_token(hub, user: str) -> tuple[str, str]:
    r = hub.api(
        "POST",
        f"/users/{user}/tokens",
        json={"note": "ssh tests", "expires_in": 3600, "scopes": [f"access:servers!server={user}/"]},
    )
    assert r.status_code == 201, r.text
    return r.json()["token"], r.json()["id"]


@pytest.fixture(scope="package")
def ssh_hub(tmp_path_factory, ssh_client_tools, singleuser_image) -> SSHHub:
    workdir = tmp_path_factory.mktemp("ssh")
    users = [f"alice{uuid.uuid4().hex[:5]}", f"bob{uuid.uuid4().hex[:5]}"]
    datasets = f"wb-ssh-datasets-{uuid.uuid4().hex[:8]}"
    docker("volume", "create", "--label", "workbench.test=1", datasets)
    with hub_pool(workdir) as start:
        hub = start(
            {
                "WORKBENCH_BACKEND": "docker",
                "WORKBENCH_IMAGE": singleuser_image,
                "WORKBENCH_SIMULATED_GPUS": "4",
                "WORKBENCH_DATASETS_VOLUME": datasets,
                # an operator's extra destination for forwards (tests/ssh/test_ssh_forwarding.py)
                "WORKBENCH_SSH_PERMIT_OPEN": "127.0.0.2:6006",
            },
            [
                "--Spawner.poll_interval=2",
                "--GPUSpawnerMixin.default_max_gpus=2",
                "--Spawner.http_timeout=120",
                "--Spawner.start_timeout=240",
                # the servers check a token with the hub again after 2 s (default 5 min), so a revoked one is refused
                "--Spawner.args=--HubOAuth.cache_max_age=2",
                # activity as the idle culler sees it, reported every 2 s instead of 5 min
                "--JupyterHub.last_activity_interval=2",
                "--Spawner.environment=JUPYTERHUB_ACTIVITY_INTERVAL=2",
            ],
        )
        try:
            ssh = SSHHub(hub, workdir, ssh_client_tools)
            hub.create_users(*users)
            for name, gpus in zip(users, (2, 0), strict=True):
                assert hub.spawn(name, gpus=gpus).status_code in (201, 202)
            for name, gpus in zip(users, (2, 0), strict=True):
                hub.wait_ready(name, timeout=180)
                ssh.enroll(name, gpus)
            yield ssh
        finally:
            for name in users:
                remove_user_objects(name)
            docker("volume", "rm", "-f", datasets, check=False)


@pytest.fixture(scope="package")
def alice(ssh_hub) -> Account:
    return ssh_hub.accounts[next(n for n in ssh_hub.accounts if n.startswith("alice"))]


@pytest.fixture(scope="package")
def bob(ssh_hub) -> Account:
    return ssh_hub.accounts[next(n for n in ssh_hub.accounts if n.startswith("bob"))]
