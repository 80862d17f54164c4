"""SSH through the hub on the local backend: the server is a local process, sshd runs as its account.

The local backend runs servers as the hub's own account, and ``workbench-sshd``
refuses to run as root (a root sshd would let every local account in). A hub run
as root checks the refusal is clean: the connection fails, nothing runs, and the
server says why. A hub run as an ordinary account (a workstation; under root the
test makes one) lets ``ssh`` in with the server's ``CUDA_VISIBLE_DEVICES``, and
every way in (``ssh``, ``scp``, ``sftp``) lands in the server's home, the one
JupyterLab shows, not in the account's passwd home.
"""

from __future__ import annotations

import getpass
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from tests.conftest import process_env
from tests.ssh.conftest import SSHHub

pytestmark = [pytest.mark.ssh, pytest.mark.integration]


HUB_ACCOUNT = "wb-hub-owner"


def ordinary_account() -> str:
    """The account a workstation's hub runs as: ours when not root, else one the test makes."""
    if os.geteuid() != 0:
        return getpass.getuser()
    try:
        pwd.getpwnam(HUB_ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", HUB_ACCOUNT], check=True)
    return HUB_ACCOUNT


@pytest.mark.parametrize(
    "as_root", [True, False] if os.geteuid() == 0 else [False], ids=lambda r: "as-root" if r else "as-account"
)
def test_ssh_through_a_local_backend_hub(running_hub, ssh_client_tools, tmp_path, as_root):
    account = "root" if as_root else ordinary_account()
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": "2"},
        ["--Spawner.start_timeout=180"],
        run_as=None if as_root or account == getpass.getuser() else account,
    )
    user = "carol"
    hub.create_users(user)
    assert hub.spawn(user, gpus=1).status_code in (201, 202)
    hub.wait_ready(user, timeout=180)
    ssh = SSHHub(hub, tmp_path, ssh_client_tools)
    ssh.enroll(user, 1)
    info = ssh.server_api(user, "GET", "").json()
    assert info["login_user"] == account

    r = ssh.run("ssh", user, "HOST", "printenv CUDA_VISIBLE_DEVICES; printenv WORKBENCH_GPUS", timeout=120)
    if as_root:
        assert r.returncode != 0
        assert r.stdout == ""
        assert "refusing to run as root" in hub.log()
        return
    assert r.returncode == 0, r.stderr
    leased = hub.leases()[user]
    assert r.stdout.splitlines() == [",".join(leased), ",".join(leased)]

    # the same home as JupyterLab: the server's HOME, which is not the account's passwd home
    home = process_env(int(hub.server(user)["state"]["pid"]))["HOME"]
    assert home != pwd.getpwnam(account).pw_dir
    r = ssh.run("ssh", user, "HOST", 'pwd; echo "$HOME"')
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.splitlines() == [home, home], (r.stdout, r.stderr)
    laptop_file = tmp_path / "from-the-laptop.txt"
    laptop_file.write_text("copied with scp\n")
    r = ssh.run("scp", user, "-q", str(laptop_file), "HOST:")
    assert r.returncode == 0, r.stderr
    assert (Path(home) / laptop_file.name).read_text() == "copied with scp\n"
    r = ssh.run("sftp", user, "-b", "-", "HOST", input="pwd\nls -1\n")
    assert r.returncode == 0, r.stderr
    assert f"Remote working directory: {home}\n" in r.stdout
    assert laptop_file.name in r.stdout.splitlines()
