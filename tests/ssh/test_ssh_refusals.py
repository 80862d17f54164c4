"""Every way in that must stay shut: no token, someone else's token, a revoked
token, a key not in authorized_keys, a password, root. Each is refused for its
own reason (the server's 403 before any byte reaches sshd, or sshd's refusal),
and nothing of the other user's is reachable (tests/ssh/conftest.py's shared hub)."""

from __future__ import annotations

import time

import pytest
import requests

from tests.ssh.conftest import scoped_token

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.integration]

MARK = "reached-the-shell"
#: the single-user server's answer to a websocket it does not authenticate, as the proxy words it
FORBIDDEN = "(HTTP 403 Forbidden)"
#: sshd's refusal of every way in but a listed key
NO_KEY = "Permission denied (publickey)"


def assert_refused(result, says: str):
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert MARK not in result.stdout, (result.stdout, result.stderr)
    assert says in result.stderr, result.stderr


def upgrade(ssh_hub, user: str, token: str | None = None) -> requests.Response:
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    if token:
        headers["Authorization"] = f"token {token}"
    return requests.get(f"{ssh_hub.hub.url}/user/{user}/sshd/", allow_redirects=False, timeout=30, headers=headers)


def test_without_a_token_the_websocket_is_refused(ssh_hub, alice):
    # the documented client will not even try without a token...
    assert_refused(
        ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", token=""),
        "no hub token in the environment variable WORKBENCH_HUB_TOKEN",
    )
    # ...and the server refuses a websocket that comes without one (jupyter-server-proxy: 403, no login redirect)
    assert upgrade(ssh_hub, alice.name).status_code == 403
    assert upgrade(ssh_hub, alice.name, alice.token).status_code == 101  # the same request with her token opens


def test_another_users_token_reaches_nothing_of_alices(ssh_hub, alice, bob):
    # bob's token (and even bob's key) on alice's server
    assert_refused(ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", token=bob.token), FORBIDDEN)
    assert_refused(ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", token=bob.token, identity=bob.key), FORBIDDEN)
    assert upgrade(ssh_hub, alice.name, bob.token).status_code == 403
    # nor her SSH page, nor her keys
    assert ssh_hub.server_api(alice.name, "GET", "", token=bob.token).status_code == 403
    r = ssh_hub.server_api(
        alice.name, "POST", "/keys", token=bob.token, json={"key": (ssh_hub.workdir / f"id_{bob.name}.pub").read_text()}
    )
    assert r.status_code == 403
    keys = ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"]
    comments = [k["comment"] for k in keys]
    assert f"{alice.name}@laptop" in comments
    assert f"{bob.name}@laptop" not in comments


def test_a_revoked_token_is_refused(ssh_hub, alice):
    token, token_id = scoped_token(ssh_hub.hub, alice.name)
    ok = ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", token=token)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == MARK, ok.stderr
    r = ssh_hub.hub.api("DELETE", f"/users/{alice.name}/tokens/{token_id}")
    assert r.status_code == 204, r.text
    time.sleep(3)  # the server's token cache (HubOAuth.cache_max_age, 2 s in these tests)
    assert_refused(ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", token=token), FORBIDDEN)


def test_a_key_not_in_authorized_keys_is_refused(ssh_hub, alice):
    stranger = ssh_hub.keygen("stranger")
    assert_refused(ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", identity=stranger), NO_KEY)


def test_passwords_are_never_asked_for(ssh_hub, alice):
    r = ssh_hub.run(
        "ssh",
        alice.name,
        "-v",
        "-o",
        "PubkeyAuthentication=no",
        "-o",
        "PreferredAuthentications=password,keyboard-interactive",
        "HOST",
        f"echo {MARK}",
    )
    assert_refused(r, NO_KEY)
    # the server offers nothing but public keys
    offered = [line for line in r.stderr.splitlines() if "Authentications that can continue" in line]
    assert offered, offered
    assert all(line.rstrip().endswith(": publickey") for line in offered), offered


def test_root_login_is_refused(ssh_hub, alice):
    assert_refused(ssh_hub.run("ssh", alice.name, "HOST", f"echo {MARK}", login="root"), NO_KEY)
