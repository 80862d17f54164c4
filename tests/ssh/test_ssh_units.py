"""Rules of workbench-ssh without a hub: key validation, sshd's options, the client config."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import struct
from pathlib import Path

import pytest

from workbench_ssh import client_config, keys, sshd

pytestmark = pytest.mark.ssh


def _keygen(tmp_path, kind: str, bits: int | None = None) -> str:
    if shutil.which("ssh-keygen") is None:
        from tests.conftest import missing

        missing("ssh-keygen is not installed (apt-get install openssh-client)")
    path = tmp_path / f"id_{kind}{bits or ''}"
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@laptop", "-f", str(path)]
    if bits:
        args += ["-b", str(bits)]
    subprocess.run(args, check=True)
    return (tmp_path / f"{path.name}.pub").read_text().strip()


def test_a_valid_key_is_added_once_with_the_modes_sshd_wants(tmp_path):
    line = _keygen(tmp_path, "ed25519")
    home = tmp_path / "home"
    key, added = keys.add_key(home, line + "\n")
    assert added and key.fingerprint.startswith("SHA256:") and key.comment == "me@laptop"
    key2, added2 = keys.add_key(home, line)
    assert not added2 and key2.fingerprint == key.fingerprint
    path = keys.authorized_keys_path(home)
    assert path.read_text() == line + "\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert keys.listed_keys(home) == [{"type": "ssh-ed25519", "fingerprint": key.fingerprint, "comment": "me@laptop"}]


def _blob(key_type: str) -> str:
    return base64.b64encode(struct.pack(">I", len(key_type)) + key_type.encode() + b"\0" * 40).decode()


@pytest.mark.parametrize(
    "text, says",
    [
        ("", "Paste a public key"),
        ("   \n", "Paste a public key"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----", "PRIVATE key"),
        ("ssh-ed25519 AAAA one\nssh-ed25519 AAAA two", "exactly one key"),
        ('command="rm -rf ~" ssh-ed25519 AAAAC3Nza', "not a supported key type"),
        ("ssh-dss AAAAB3NzaC1kc3M", "not a supported key type"),
        ("ssh-ed25519", "no base64 body"),
        ("ssh-ed25519 not*base64!", "not valid base64"),
        (f"ssh-ed25519 {_blob('ssh-rsa')}", "does not match its type"),
        (f"ssh-ed25519 {_blob('ssh-ed25519')}", "OpenSSH does not accept"),
        ("ssh-ed25519 AAAA\x07bell", "control characters"),
        ("ssh-ed25519 " + "A" * 20000, "far too long"),
    ],
)
def test_a_bad_key_is_refused_with_a_sentence_and_changes_nothing(tmp_path, text, says):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    before = "ssh-ed25519 AAAAexisting me@old\n"
    keys.authorized_keys_path(home).write_text(before)
    with pytest.raises(keys.InvalidKey, match=says):
        keys.add_key(home, text)
    assert keys.authorized_keys_path(home).read_text() == before
    assert sorted(os.listdir(home / ".ssh")) == ["authorized_keys"]


def test_a_short_rsa_key_is_refused(tmp_path):
    with pytest.raises(keys.InvalidKey, match="1024 bits"):
        keys.parse_public_key(_keygen(tmp_path, "rsa", 1024))


def test_sshd_options_allow_only_this_users_keys_and_carry_only_the_gpu_variables():
    env = {"WORKBENCH_GPUS": "GPU-a,GPU-b", "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "PATH": "/opt/v/bin:/usr/bin",
           "JUPYTERHUB_API_TOKEN": "secret", "HOME": "/home/jovyan"}
    cmd = sshd.sshd_command("4242", "jovyan", env, ["/usr/sbin/sshd", "-f", "none", "-o", "ListenAddress 127.0.0.1:{port}"])
    assert cmd[:5] == ["/usr/sbin/sshd", "-f", "none", "-o", "ListenAddress 127.0.0.1:4242"]
    options = [cmd[i + 1] for i, part in enumerate(cmd) if part == "-o"]
    for wanted in ("PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin no",
                   "AuthenticationMethods publickey", "AllowUsers jovyan", "PermitUserEnvironment no"):
        assert wanted in options
    setenv = [o for o in options if o.startswith("SetEnv ")]
    assert setenv == ["SetEnv WORKBENCH_GPUS=GPU-a,GPU-b CUDA_VISIBLE_DEVICES=GPU-a,GPU-b PATH=/opt/v/bin:/usr/bin"]
    assert "secret" not in " ".join(cmd)


def test_sshd_reads_the_keys_the_page_writes_in_the_servers_home():
    # Local backend: the server runs as the hub's account with HOME set to the hub user's home.
    # jupyter-sshd-proxy's command names a relative keys file; sshd would keep that first value.
    base = ["/usr/sbin/sshd", "-f", "none", "-o", "AuthorizedKeysFile .ssh/authorized_keys .ssh/authorized_keys2",
            "-o", "LogLevel INFO"]
    cmd = sshd.sshd_command("4242", "hubowner", {}, base, home="/srv/wb/homes/carol")
    options = [cmd[i + 1] for i, part in enumerate(cmd) if part == "-o"]
    assert [o for o in options if o.lower().startswith("authorizedkeysfile")] == [
        "AuthorizedKeysFile /srv/wb/homes/carol/.ssh/authorized_keys"]
    assert cmd[:3] == ["/usr/sbin/sshd", "-f", "none"] and "LogLevel INFO" in options
    assert keys.authorized_keys_path("/srv/wb/homes/carol") == Path("/srv/wb/homes/carol/.ssh/authorized_keys")


def test_a_cpu_only_server_still_tells_sessions_it_has_no_gpu():
    assert sshd.session_environment({"WORKBENCH_GPUS": ""}) == ["WORKBENCH_GPUS="]
    assert sshd.quote_setenv(["A=x y", "B=z"]) == '"A=x y" B=z'


def test_workbench_sshd_refuses_bad_arguments(capsys):
    assert sshd.main(["not-a-port"]) == 2
    assert "usage" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the refusal to run as root")
def test_workbench_sshd_refuses_to_run_as_root(capsys):
    assert sshd.main(["2222"]) == 1
    assert "refusing to run as root" in capsys.readouterr().err


@pytest.mark.parametrize(
    "public, base, url",
    [
        ("https://hub.example.org", "/user/alice/", "wss://hub.example.org/user/alice/sshd/"),
        ("http://127.0.0.1:8000", "/user/alice/", "ws://127.0.0.1:8000/user/alice/sshd/"),
        ("https://example.org/jhub/", "/jhub/user/a%40b/gpu/", "wss://example.org/jhub/user/a%40b/gpu/sshd/"),
    ],
)
def test_websocket_url(public, base, url):
    assert client_config.websocket_url(public.rstrip("/").rsplit("/jhub", 1)[0], base) == url


def test_the_config_entry_names_alias_user_proxy_and_token_source():
    alias = client_config.host_alias("hub.example.org:443", "a@b", "gpu")
    assert alias == "workbench-hub.example.org-a-b-gpu"
    text = client_config.ssh_config(alias, "jovyan", "wss://hub.example.org/user/a%40b/gpu/sshd/", "env")
    assert text.splitlines()[:4] == [
        f"Host {alias}", "    User jovyan", f"    HostKeyAlias {alias}",
        '    ProxyCommand websocat --binary -H="Authorization: token ${WORKBENCH_HUB_TOKEN}" asyncstdio: '
        "wss://hub.example.org/user/a%40b/gpu/sshd/",
    ]
    assert "$(cat ~/.ssh/workbench-token)" in client_config.ssh_config(alias, "jovyan", "wss://h/u/", "file")
    assert "ServerAliveInterval 30" in text
