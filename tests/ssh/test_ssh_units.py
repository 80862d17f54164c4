"""Rules of workbench-ssh without a hub: key validation, sshd's options, the client config."""

from __future__ import annotations

import base64
import os
import re
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from workbench_ssh import client_config, handlers, keys, sshd

pytestmark = pytest.mark.ssh


def _keygen(tmp_path, kind: str, bits: int | None = None, name: str | None = None) -> str:
    if shutil.which("ssh-keygen") is None:
        from tests.conftest import missing

        missing("ssh-keygen is not installed (apt-get install openssh-client)")
    path = tmp_path / (name or f"id_{kind}{bits or ''}")
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "me@laptop", "-f", str(path)]
    if bits:
        args += ["-b", str(bits)]
    subprocess.run(args, check=True)
    return (tmp_path / f"{path.name}.pub").read_text().strip()


def test_a_valid_key_is_added_once_with_the_modes_sshd_wants(tmp_path):
    line = _keygen(tmp_path, "ed25519")
    home = tmp_path / "home"
    key, added = keys.add_key(home, line + "\n")
    assert added
    assert key.fingerprint.startswith("SHA256:")
    assert key.comment == "me@laptop"
    key2, added2 = keys.add_key(home, line)
    assert not added2
    assert key2.fingerprint == key.fingerprint
    path = keys.authorized_keys_path(home)
    assert path.read_text() == line + "\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert keys.listed_keys(home) == [{"type": "ssh-ed25519", "fingerprint": key.fingerprint, "comment": "me@laptop"}]


def _blob(key_type: str) -> str:
    return base64.b64encode(struct.pack(">I", len(key_type)) + key_type.encode() + b"\0" * 40).decode()


@pytest.mark.parametrize(
    ("text", "says"),
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
    with pytest.raises(keys.InvalidKeyError, match=says):
        keys.add_key(home, text)
    assert keys.authorized_keys_path(home).read_text() == before
    assert sorted(os.listdir(home / ".ssh")) == ["authorized_keys"]


def test_a_short_rsa_key_is_refused(tmp_path):
    with pytest.raises(keys.InvalidKeyError, match="1024 bits"):
        keys.parse_public_key(_keygen(tmp_path, "rsa", 1024))


SFTP = "/usr/lib/openssh/sftp-server"
BASE = [
    "/usr/sbin/sshd",
    "-h",
    "/home/jovyan/.ssh/jupyter_sshd_hostkey",
    "-D",
    "-e",
    "-f",
    "none",
    "-o",
    "ListenAddress 127.0.0.1:{port}",
    "-o",
    "PrintLastLog no",
    "-o",
    "AuthorizedKeysFile .ssh/authorized_keys .ssh/authorized_keys2",
    "-o",
    "LogLevel INFO",
    "-o",
    "Subsystem    sftp    internal-sftp",
]  # jupyter-sshd-proxy 0.3.0's command


def options_of(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, part in enumerate(cmd) if part == "-o"]


def test_sshd_options_allow_only_this_users_keys_and_carry_only_the_gpu_variables():
    env = {
        "WORKBENCH_GPUS": "GPU-a,GPU-b",
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b",
        "PATH": "/opt/v/bin:/usr/bin",
        "JUPYTERHUB_API_TOKEN": "secret",
        "HOME": "/home/jovyan",
    }
    cmd = sshd.sshd_command("4242", "jovyan", env, BASE, "/home/jovyan", SFTP)
    assert cmd[:7] == BASE[:7]
    assert "ListenAddress 127.0.0.1:4242" in options_of(cmd)
    options = options_of(cmd)
    for wanted in (
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "AuthenticationMethods publickey",
        "AllowUsers jovyan",
        "PermitUserEnvironment no",
        "PermitUserRC no",
    ):
        assert wanted in options
    setenv = [o for o in options if o.startswith("SetEnv ")]
    assert setenv == [
        "SetEnv WORKBENCH_GPUS=GPU-a,GPU-b CUDA_VISIBLE_DEVICES=GPU-a,GPU-b PATH=/opt/v/bin:/usr/bin HOME=/home/jovyan"
    ]
    assert "secret" not in " ".join(cmd)


def test_sshd_forwards_local_ports_only():
    options = options_of(sshd.sshd_command("4242", "jovyan", {}, BASE, "/home/jovyan", SFTP))
    for wanted in (
        "AllowTcpForwarding local",
        "AllowAgentForwarding no",
        "AllowStreamLocalForwarding no",
        "PermitTunnel no",
        "X11Forwarding no",
    ):
        assert wanted in options


def test_every_session_lands_in_the_servers_home():
    # Local backend: the server runs as the hub's account with HOME set to the hub user's home.
    # jupyter-sshd-proxy's command names a relative keys file (sshd would keep that first value,
    # resolved against the passwd home) and internal-sftp (a second Subsystem sftp is an error).
    home = "/srv/wb data/homes/carol"
    cmd = sshd.sshd_command("4242", "hubowner", {}, BASE, home, SFTP)
    options = options_of(cmd)
    assert [o for o in options if o.lower().startswith("authorizedkeysfile")] == [
        'AuthorizedKeysFile "/srv/wb data/homes/carol/.ssh/authorized_keys"'
    ]
    assert [o for o in options if o.lower().startswith("subsystem")] == [f"Subsystem sftp {SFTP}"]
    assert f"ForceCommand /bin/sh {sshd.SESSION_SCRIPT} '{home}' {SFTP}" in options
    assert 'SetEnv "HOME=/srv/wb data/homes/carol"' in options
    assert cmd[:7] == BASE[:7]
    assert "LogLevel INFO" in options
    assert keys.authorized_keys_path(home) == Path(home) / ".ssh" / "authorized_keys"


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain/path", "plain/path"),
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("not#comment", '"not#comment"'),
        ("", '""'),
    ],
)
def test_words_are_quoted_for_sshds_option_parser(word, quoted):
    assert sshd.sshd_word(word) == quoted


def test_a_percent_in_the_home_is_not_an_sshd_token():
    options = options_of(sshd.sshd_command("1", "u", {}, BASE, "/h/100%", SFTP))
    assert "AuthorizedKeysFile /h/100%%/.ssh/authorized_keys" in options


@pytest.mark.parametrize(
    ("home", "says"),
    [
        ("relative/home", "not an absolute path"),
        ("/tmp/back\\slash", "no newlines or backslashes"),
        ("/tmp/new\nline", "no newlines or backslashes"),
        ("/nonexistent/workbench-home", "does not exist"),
    ],
)
def test_a_home_sshd_cannot_be_given_is_refused_with_a_sentence(home, says):
    with pytest.raises(sshd.SetupError, match=says):
        sshd.server_home({"HOME": home})


def _run_session(tmp_path, home: Path, command: str | None, extra_env: dict[str, str] | None = None):
    """Run session.sh as sshd's ForceCommand would, with a stand-in shell and sftp-server that
    report how they were started."""
    report = tmp_path / "report"
    fake = tmp_path / "fake"
    fake.write_text(f'#!/bin/sh\n{{ echo "argv:$0 $*"; echo "pwd:$(pwd)"; env; }} > {report}\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SHELL": str(fake), "OLDPWD": "/home/account"}
    if command is not None:
        env["SSH_ORIGINAL_COMMAND"] = command
    env.update(extra_env or {})
    subprocess.run(
        ["/bin/sh", str(sshd.SESSION_SCRIPT), str(home), str(fake)], env=env, cwd="/", check=True, timeout=10
    )
    lines = report.read_text().splitlines()
    return lines[0], lines[1], dict(line.split("=", 1) for line in lines[2:] if "=" in line)


def test_the_session_wrapper_runs_commands_sftp_and_login_shells_in_the_home(tmp_path):
    home = tmp_path / "server home"
    home.mkdir()
    argv, pwd_line, env = _run_session(tmp_path, home, "echo hi; pwd")
    assert argv == f"argv:{tmp_path / 'fake'} -c echo hi; pwd"
    assert pwd_line == f"pwd:{home}"
    assert "SSH_ORIGINAL_COMMAND" not in env
    assert "OLDPWD" not in env
    assert env["HOME"] == str(home)
    # the sftp subsystem (sshd passes the subsystem's command): sftp-server starts in the home
    argv, pwd_line, _ = _run_session(tmp_path, home, str(tmp_path / "fake"))
    assert argv == f"argv:{tmp_path / 'fake'} -d {home}"
    assert pwd_line == f"pwd:{home}"
    # no command: a login shell
    argv, pwd_line, _ = _run_session(tmp_path, home, None)
    assert argv == f"argv:{tmp_path / 'fake'} -l"
    assert pwd_line == f"pwd:{home}"


def test_the_session_wrapper_escapes_sftp_servers_percent_tokens(tmp_path):
    home = tmp_path / "100%"
    home.mkdir()
    argv, _, _ = _run_session(tmp_path, home, str(tmp_path / "fake"))
    assert argv == f"argv:{tmp_path / 'fake'} -d {tmp_path}/100%%"


def test_the_session_wrapper_refuses_a_missing_home(tmp_path):
    r = subprocess.run(
        ["/bin/sh", str(sshd.SESSION_SCRIPT), str(tmp_path / "gone"), "/bin/true"],
        env={"PATH": "/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": "echo reached"},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr == f"workbench-ssh: cannot enter the server's home {tmp_path / 'gone'}\n"


def test_a_cpu_only_server_still_tells_sessions_it_has_no_gpu():
    assert sshd.session_environment({"WORKBENCH_GPUS": ""}) == ["WORKBENCH_GPUS="]
    assert sshd.quote_setenv(["A=x y", "B=z"]) == '"A=x y" B=z'


@pytest.mark.parametrize("argv", [["not-a-port"], [], ["--check"], ["1", "2"], ["--check", "x"]])
def test_workbench_sshd_refuses_bad_arguments(capsys, argv):
    assert sshd.main(argv) == 2
    assert "usage: workbench-sshd PORT" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the refusal to run as root")
def test_workbench_sshd_refuses_to_run_as_root(capsys):
    assert sshd.main(["2222"]) == 1
    assert "refusing to run as root" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("public", "hub_base", "base", "url"),
    [
        ("https://hub.example.org", "/", "/user/alice/", "wss://hub.example.org/user/alice/sshd/"),
        ("http://127.0.0.1:8000", "/", "/user/alice/", "ws://127.0.0.1:8000/user/alice/sshd/"),
        # the hub's base URL in WORKBENCH_PUBLIC_URL is not added a second time
        ("https://example.org/jhub/", "/jhub/", "/jhub/user/a%40b/gpu/", "wss://example.org/jhub/user/a%40b/gpu/sshd/"),
        ("https://example.org/jhub", "/jhub/", "/jhub/user/a/", "wss://example.org/jhub/user/a/sshd/"),
        ("https://example.org", "/jhub/", "/jhub/user/a/", "wss://example.org/jhub/user/a/sshd/"),
    ],
)
def test_websocket_url(public, hub_base, base, url):
    assert client_config.websocket_url(public, base, hub_base) == url


@pytest.mark.parametrize(
    ("public", "says"),
    [
        ("https://example.org/other/", "has the path /other/, but the hub's base URL is /jhub/"),
        ("ftp://example.org", "must be http(s)://host"),
        ("example.org", "must be http(s)://host"),
        ("https://example.org/jhub/?x=1", "must not have a query"),
    ],
)
def test_a_public_url_that_cannot_be_the_hubs_is_refused_with_a_sentence(public, says):
    with pytest.raises(client_config.PublicURLError, match=re.escape(says)):
        client_config.websocket_url(public, "/jhub/user/a/", "/jhub/")


def test_the_page_info_uses_the_hubs_base_url_once(tmp_path):
    env = {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_BASE_URL": "/jhub/"}
    info = handlers.ssh_info("https://example.org/jhub", "/jhub/user/alice/", env, str(tmp_path))
    assert info["websocket_url"] == "wss://example.org/jhub/user/alice/sshd/"
    assert info["token_page"] == "https://example.org/jhub/hub/token"
    assert info["proxy_script_url"] == "/jhub/user/alice/workbench/ssh/workbench-ssh-proxy.py"
    assert info["alias"] == "workbench-example.org-alice"


def test_a_named_servers_page_gives_the_entry_for_that_server(tmp_path):
    """The SSH page of alice's server big (``/user/alice/big/workbench/ssh``): its own websocket, a Host alias
    that names the server, and a token scope for that server only."""
    env = {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVER_NAME": "big", "JUPYTERHUB_BASE_URL": "/"}
    info = handlers.ssh_info("https://hub.example.org", "/user/alice/big/", env, str(tmp_path))
    assert info["websocket_url"] == "wss://hub.example.org/user/alice/big/sshd/"
    assert info["alias"] == "workbench-hub.example.org-alice+big"
    assert info["token_scope"] == "access:servers!server=alice/big"
    assert info["proxy_script_url"] == "/user/alice/big/workbench/ssh/workbench-ssh-proxy.py"
    assert info["ssh_config"].splitlines()[:4] == [
        "Host workbench-hub.example.org-alice+big",
        f"    User {info['login_user']}",
        "    HostKeyAlias workbench-hub.example.org-alice+big",
        "    ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-file ~/.ssh/workbench-token "
        "wss://hub.example.org/user/alice/big/sshd/",
    ]
    default = handlers.ssh_info("https://hub.example.org", "/user/alice/", {"JUPYTERHUB_USER": "alice"}, str(tmp_path))
    assert (default["alias"], default["token_scope"]) == (
        "workbench-hub.example.org-alice",
        "access:servers!server=alice/",
    )


def test_the_config_entry_names_alias_user_proxy_and_token_source():
    alias = client_config.host_alias("hub.example.org:443", "a@b", "gpu")
    assert alias == "workbench-hub.example.org-a-b+gpu"
    assert client_config.host_alias("hub.example.org", "a@b") == "workbench-hub.example.org-a-b"
    assert client_config.host_alias("hub", "alice-big") != client_config.host_alias("hub", "alice", "big")
    text = client_config.ssh_config(alias, "jovyan", "wss://hub.example.org/user/a%40b/gpu/sshd/", "env")
    assert text.splitlines()[:4] == [
        f"Host {alias}",
        "    User jovyan",
        f"    HostKeyAlias {alias}",
        # ssh expands %-tokens in ProxyCommand: the escaped @ is written %%40
        "    ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-env WORKBENCH_HUB_TOKEN "
        "wss://hub.example.org/user/a%%40b/gpu/sshd/",
    ]
    assert (
        "ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-file ~/.ssh/workbench-token wss://h/u/"
        in client_config.ssh_config(alias, "jovyan", "wss://h/u/", "file")
    )
    assert "ServerAliveInterval 30" in text
    with pytest.raises(ValueError, match="'file' or 'env'"):
        client_config.proxy_command("wss://h/u/", "argv")


@pytest.mark.parametrize(
    ("alias", "url"),
    [
        ("wb-alias", "wss://hub.example.org/user/a%40b/sshd/"),
        # a named server's alias, as the page of a@b's server big gives it
        (client_config.host_alias("hub.example.org", "a@b", "big"), "wss://hub.example.org/user/a%40b/big/sshd/"),
    ],
)
def test_ssh_runs_the_proxy_command_with_the_url_intact(tmp_path, alias, url):
    """ssh expands %-tokens and the shell expands ~ in the ProxyCommand: with a stand-in
    ``python3`` that records its arguments, the proxy gets the escaped URL and real paths."""
    if shutil.which("ssh") is None:
        from tests.conftest import missing

        missing("ssh is not installed (apt-get install openssh-client)")
    bin_dir, record = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    (bin_dir / "python3").chmod(0o755)
    cfg = tmp_path / "config"
    cfg.write_text(client_config.ssh_config(alias, "jovyan", url, "file"))
    subprocess.run(
        ["ssh", "-F", str(cfg), "-o", "BatchMode=yes", alias, "true"],
        capture_output=True,
        timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert record.read_text().splitlines() == [
        f"{tmp_path}/.ssh/workbench-ssh-proxy.py",
        "--token-file",
        f"{tmp_path}/.ssh/workbench-token",
        url,
    ]


def test_two_keys_added_at_once_both_land(tmp_path, monkeypatch):
    """The read-modify-write of authorized_keys is serialised: with a slow rename in between,
    an unlocked add would overwrite the other's key."""
    home = tmp_path / "home"
    lines = [_keygen(tmp_path, "ed25519", name=f"id_{n}") for n in range(3)]
    real_replace = os.replace

    def slow_replace(src, dst):
        time.sleep(0.3)
        real_replace(src, dst)

    monkeypatch.setattr(keys.os, "replace", slow_replace)
    barrier = threading.Barrier(len(lines))
    results: list[bool] = []

    def add(line: str) -> None:
        barrier.wait()
        results.append(keys.add_key(home, line)[1])

    threads = [threading.Thread(target=add, args=(line,)) for line in lines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True, True, True]
    assert sorted(keys.authorized_keys_path(home).read_text().splitlines()) == sorted(lines)
    assert sorted(os.listdir(home / ".ssh")) == ["authorized_keys"]  # no lock or temporary file left
