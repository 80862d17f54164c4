"""The single-user image's OpenSSH: present, without baked-in host keys, never as root."""

from __future__ import annotations

import pytest

from tests.docker.conftest import docker

pytestmark = [pytest.mark.ssh, pytest.mark.docker]


def test_the_image_has_openssh_and_rsync_but_no_host_keys_of_its_own(singleuser_image):
    out = docker(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        singleuser_image,
        "-c",
        "id -u; for t in sshd ssh rsync workbench-sshd; do command -v $t; done; ls /etc/ssh/ | grep -c host_ || true;"
        " python3 -c 'import jupyter_sshd_proxy, jupyter_server_proxy, workbench_ssh; print(\"imports-ok\")'",
    ).stdout
    lines = out.split()
    assert lines[0] == "1000"
    assert {"/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/rsync", "/opt/workbench/venv/bin/workbench-sshd"} <= set(lines)
    assert "imports-ok" in lines
    assert lines[-2] == "0"
    config = docker(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        singleuser_image,
        "-c",
        "cat /opt/workbench/venv/etc/jupyter/jupyter_server_config.d/workbench_ssh.json",
    ).stdout
    assert '"workbench_ssh": true' in config


def test_sshd_never_runs_as_root_and_takes_only_keys(singleuser_image):
    r = docker("run", "--rm", "--user", "0", "--entrypoint", "workbench-sshd", singleuser_image, "2222", check=False)
    assert r.returncode == 1
    assert "refusing to run as root" in r.stderr
    # the effective configuration (sshd -T) of exactly the command main() runs, home included:
    # `workbench-sshd --check PORT` builds it as `workbench-sshd PORT` does and asks sshd to print it
    r = docker("run", "--rm", "--entrypoint", "workbench-sshd", singleuser_image, "--check", "2222", check=False)
    assert r.returncode == 0, r.stderr
    effective = r.stdout.lower().splitlines()
    for line in (
        "passwordauthentication no",
        "kbdinteractiveauthentication no",
        "permitrootlogin no",
        "authenticationmethods publickey",
        "allowusers jovyan",
        "pubkeyauthentication yes",
        "listenaddress 127.0.0.1:2222",
        "permituserenvironment no",
        "permituserrc no",
        # forwarding: -L and -D (VS Code), nothing else
        "allowtcpforwarding local",
        "allowagentforwarding no",
        "allowstreamlocalforwarding no",
        "permittunnel no",
        "x11forwarding no",
        # -L and -D lead only to the container's own loopback unless the hub says more (WORKBENCH_SSH_PERMIT_OPEN)
        "permitopen localhost:* 127.0.0.1:* [::1]:*",
        # every session in the server's home, which in the image is the passwd home
        "authorizedkeysfile /home/jovyan/.ssh/authorized_keys",
        "setenv home=/home/jovyan",
        "subsystem sftp /usr/lib/openssh/sftp-server",
    ):
        assert line in effective, r.stdout
    force = [line for line in effective if line.startswith("forcecommand ")]
    assert len(force) == 1
    assert force[0].endswith("/workbench_ssh/session.sh /home/jovyan /usr/lib/openssh/sftp-server")


def test_login_shells_get_the_images_path(singleuser_image):
    """Debian's /etc/profile resets PATH for login shells; the image's profile.d restores it."""
    out = docker(
        "run", "--rm", "--entrypoint", "bash", singleuser_image, "-lc", 'command -v python; printf "%s\\n" "$PATH"'
    ).stdout.splitlines()
    image_path = docker(
        "image", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", singleuser_image
    ).stdout
    assert out[0] == "/opt/workbench/venv/bin/python"
    assert f"PATH={out[1]}" in image_path.splitlines()


#: every shape of entry the hub accepts (tests/unit/test_ssh_forwarding.py), as the hub hands them over
WIDE = "db.internal:5432,10.0.0.7:*,[fd00::7]:8888,[fe80::1%eth0]:22,*:8888,gpu_node-3.cluster:8080"


@pytest.mark.parametrize(
    ("value", "effective"),
    [
        (WIDE, "permitopen localhost:* 127.0.0.1:* [::1]:* " + WIDE.replace(",", " ")),
        ("any", "permitopen any"),
    ],
)
def test_the_images_sshd_takes_what_the_hub_hands_over(singleuser_image, value, effective):
    """Debian 12's OpenSSH 9.2 accepts every entry shape the hub lets through (sshd -T would refuse a bad one)."""
    r = docker(
        "run", "--rm", "-e", f"WORKBENCH_SSH_PERMIT_OPEN={value}", "--entrypoint", "workbench-sshd",
        singleuser_image, "--check", "2222", check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert effective in r.stdout.lower().splitlines(), r.stdout


def test_a_value_the_hub_would_refuse_stops_sshd(singleuser_image):
    r = docker(
        "run", "--rm", "-e", "WORKBENCH_SSH_PERMIT_OPEN=db:80 any", "--entrypoint", "workbench-sshd",
        singleuser_image, "--check", "2222", check=False,
    )  # fmt: skip
    assert r.returncode == 1
    assert "WORKBENCH_SSH_PERMIT_OPEN in the server's environment holds 'db:80 any'" in r.stderr
