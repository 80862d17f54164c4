"""The single-user image's OpenSSH: present, without baked-in host keys, never as root."""

from __future__ import annotations

import pytest

from tests.docker.conftest import docker

pytestmark = [pytest.mark.ssh, pytest.mark.docker]


def test_the_image_has_openssh_and_rsync_but_no_host_keys_of_its_own(singleuser_image):
    out = docker("run", "--rm", "--entrypoint", "sh", singleuser_image, "-c",
                 "id -u; for t in sshd ssh rsync workbench-sshd; do command -v $t; done; ls /etc/ssh/ | grep -c host_ || true;"
                 " python3 -c 'import jupyter_sshd_proxy, jupyter_server_proxy, workbench_ssh; print(\"imports-ok\")'").stdout
    lines = out.split()
    assert lines[0] == "1000"
    assert {"/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/rsync", "/opt/workbench/venv/bin/workbench-sshd"} <= set(lines)
    assert "imports-ok" in lines and lines[-2] == "0"  # no /etc/ssh/ssh_host_* keys shipped to every user
    config = docker("run", "--rm", "--entrypoint", "sh", singleuser_image, "-c",
                    "cat /opt/workbench/venv/etc/jupyter/jupyter_server_config.d/workbench_ssh.json").stdout
    assert '"workbench_ssh": true' in config


def test_sshd_never_runs_as_root_and_takes_only_keys(singleuser_image):
    r = docker("run", "--rm", "--user", "0", "--entrypoint", "workbench-sshd", singleuser_image, "2222", check=False)
    assert r.returncode == 1 and "refusing to run as root" in r.stderr
    # the effective configuration of the command jupyter-server-proxy runs (sshd -T prints it)
    script = ("from jupyter_sshd_proxy import setup_sshd; import getpass, os, subprocess; "
              "from workbench_ssh.sshd import sshd_command; "
              "cmd = sshd_command('2222', getpass.getuser(), dict(os.environ), setup_sshd()['command']); "
              "print(subprocess.run(cmd + ['-T'], capture_output=True, text=True).stdout)")
    effective = docker("run", "--rm", "--entrypoint", "python3", singleuser_image, "-c", script).stdout.lower()
    for line in ("passwordauthentication no", "kbdinteractiveauthentication no", "permitrootlogin no",
                 "authenticationmethods publickey", "allowusers jovyan", "pubkeyauthentication yes",
                 "listenaddress 127.0.0.1:2222", "permituserenvironment no"):
        assert line in effective.splitlines(), effective
