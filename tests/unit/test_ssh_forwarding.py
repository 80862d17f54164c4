"""Where SSH forwards may lead: WORKBENCH_SSH_PERMIT_OPEN from the hub's check to sshd's PermitOpen line.

The hub checks the operator's value (``workbench_spawner/ssh_forwarding.py``, sentences that name
the bad entry) and hands it to every server, whose ``workbench-sshd`` turns it into sshd's
``PermitOpen`` after the server's own loopback (``workbench_ssh/sshd.py``). One table drives both
sides, so that what the hub accepts the server takes, and what the hub refuses the server refuses
too. The real sshd (Debian 12's OpenSSH 9.2) takes the lines in tests/ssh/test_ssh_image.py, and the
forwards themselves are tried through a real hub in tests/ssh/test_ssh_forwarding.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets import TraitError
from traitlets.config import Config

from tests.unit.fake_backends import FakeHostSpawner
from workbench_spawner.policy.gpu_policy import _policies
from workbench_spawner.ssh_forwarding import (
    ENV,
    PermitOpenError,
    SSHForwarding,
    parse_permit_open,
    ssh_forwarding_problems,
)
from workbench_ssh import sshd

OWN = "PermitOpen localhost:* 127.0.0.1:* [::1]:*"

#: the operator's value, what the hub hands the servers, the sshd option the server runs with
GOOD = [
    ("", "", OWN),
    ("  ", "", OWN),
    ("db.internal:5432", "db.internal:5432", f"{OWN} db.internal:5432"),
    (" db.internal:5432 , 10.0.0.7:* ", "db.internal:5432,10.0.0.7:*", f"{OWN} db.internal:5432 10.0.0.7:*"),
    ("db:1,,db:2,", "db:1,db:2", f"{OWN} db:1 db:2"),
    ("[fd00::7]:8888", "[fd00::7]:8888", f"{OWN} [fd00::7]:8888"),
    ("[fe80::1%eth0]:22", "[fe80::1%eth0]:22", f"{OWN} [fe80::1%eth0]:22"),
    ("*:8888", "*:8888", f"{OWN} *:8888"),
    ("gpu_node-3.cluster:08080", "gpu_node-3.cluster:8080", f"{OWN} gpu_node-3.cluster:8080"),
    ("a:1,a:1", "a:1", f"{OWN} a:1"),
    ("localhost:*,127.0.0.2:6006", "localhost:*,127.0.0.2:6006", f"{OWN} 127.0.0.2:6006"),
    ("any", "any", "PermitOpen any"),
    (" ANY ", "any", "PermitOpen any"),
]

#: the operator's value and what the sentence says; the first bad entry is named
BAD = [
    ("db.internal", "'db.internal' has no port: write host:port, e.g. db.internal:8888, or db.internal:* for every"),
    ("db.internal:http", "in 'db.internal:http' the port must be a number from 1 to 65535 or *, not 'http'"),
    ("db:0", "the port must be a number from 1 to 65535"),
    ("db:65536", "the port must be a number from 1 to 65535"),
    ("db:-1", "the port must be a number from 1 to 65535"),
    ("db:", "the port must be a number from 1 to 65535 or *, not ''"),
    ("db internal:80", "'db internal:80' has a space: separate entries with commas"),
    ("db:80 other:81", "'db:80 other:81' has a space: separate entries with commas"),
    ("db:80\nPermitOpen:any", "has a space"),
    ("::1:8888", "'::1:8888' has more than one ':'"),
    ("db:*:*", "has more than one ':'"),
    ("[fd00::7]", "write an IPv6 address as [address]:port"),
    ("[fd00::7:80", "write an IPv6 address as [address]:port"),
    ("[db.internal]:80", "'db.internal' is not an IPv6 address"),
    (":8080", "':8080' has no host"),
    ("db/x:80", "'db/x' is not a host name or address"),
    ("-oProxyCommand:80", "is not a host name or address"),
    ('"db":80', "is not a host name or address"),
    ("any,db:1", "'any' lets forwards reach every address and stands alone"),
    ("none", "'none' is not offered"),
    ("ok:1,bad", "'bad' has no port"),
]


@pytest.mark.parametrize(("value", "handed", "option"), GOOD)
def test_a_good_value_reaches_sshd_as_its_permit_open_line(value, handed, option):
    assert ",".join(parse_permit_open(value)) == handed
    assert sshd.permit_open_option({sshd.PERMIT_OPEN_VARIABLE: handed}) == option


@pytest.mark.parametrize(("value", "says"), BAD)
def test_a_bad_value_is_refused_with_a_sentence_by_the_hub_and_the_server(value, says):
    with pytest.raises(PermitOpenError) as refused:
        parse_permit_open(value)
    assert str(refused.value).startswith(f"{ENV}: ")
    assert says in str(refused.value)
    # a value the hub would refuse never reaches sshd, should it be set some other way
    with pytest.raises(sshd.SetupError, match=f"{sshd.PERMIT_OPEN_VARIABLE} in the server's environment holds"):
        sshd.permit_open_option({sshd.PERMIT_OPEN_VARIABLE: value})


def test_by_default_forwards_lead_only_to_the_servers_own_loopback_and_nothing_else_changes():
    options = [o for o in sshd.hardening_options("jovyan", {}, "/home/jovyan", "/usr/lib/openssh/sftp-server")]
    options = options[1::2]  # the values of the -o pairs
    assert [o for o in options if o.startswith("PermitOpen")] == [OWN]
    for kept in (  # -R, agent, X11, Unix sockets and tunnels stay off; -L and -D stay on
        "AllowTcpForwarding local",
        "AllowAgentForwarding no",
        "AllowStreamLocalForwarding no",
        "PermitTunnel no",
        "X11Forwarding no",
    ):
        assert kept in options
    assert not [o for o in options if o.startswith(("PermitListen", "GatewayPorts"))]  # -R is off: nothing to listen


def test_the_setting_defaults_to_the_variable_and_the_trait_takes_entries(monkeypatch):
    monkeypatch.setenv(ENV, "db.internal:5432, [fd00::7]:*")
    assert SSHForwarding().ssh_permit_open == ["db.internal:5432", "[fd00::7]:*"]
    assert SSHForwarding().ssh_environment() == {ENV: "db.internal:5432,[fd00::7]:*"}
    monkeypatch.delenv(ENV)
    assert SSHForwarding().ssh_environment() == {ENV: ""}
    assert SSHForwarding(ssh_permit_open=["ANY"]).ssh_permit_open == ["any"]
    with pytest.raises(TraitError, match="ssh_permit_open: 'db' has no port"):
        SSHForwarding(ssh_permit_open=["db"])


@pytest.mark.parametrize(
    ("env", "config", "problems"),
    [
        ({}, {}, []),
        ({ENV: "db.internal:5432"}, {}, []),
        ({ENV: "db.internal"}, {}, [f"{ENV}: 'db.internal' has no port"]),
        # a trait set in a config file wins over the variable, and is checked too
        ({ENV: "db.internal"}, {"GPUSpawnerMixin": {"ssh_permit_open": ["db.internal:5432"]}}, []),
        ({}, {"GPUSpawnerMixin": {"ssh_permit_open": ["any", "db:1"]}}, ["ssh_permit_open: 'any' lets forwards"]),
        ({}, {"FakeHostSpawner": {"ssh_permit_open": ["db:x"]}}, ["ssh_permit_open: in 'db:x' the port must"]),
    ],
)
def test_the_hub_checks_the_setting_at_start(monkeypatch, env, config, problems):
    """What hub/jupyterhub_config.py runs on the final config: a sentence stops the hub (exit 2)."""
    monkeypatch.delenv(ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    found = ssh_forwarding_problems(Config(config), FakeHostSpawner)
    assert len(found) == len(problems), found
    assert all(f.startswith(p) for f, p in zip(found, problems, strict=True)), found


def test_every_servers_environment_carries_the_setting(tmp_path, monkeypatch):
    """The GPU spawner (every backend) hands the checked value to the server it starts."""
    monkeypatch.setenv(ENV, "db.internal:5432,db.internal:5432")
    _policies.clear()
    try:
        spawner = FakeHostSpawner(
            user=SimpleNamespace(name="alice", url="/user/alice/", escaped_name="alice"),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
            simulated_gpus="2",
        )
        assert spawner.get_env()[ENV] == "db.internal:5432"
    finally:
        _policies.clear()
