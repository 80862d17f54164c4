"""The SSH page's entry when users' servers are on their own subdomains (``WORKBENCH_SUBDOMAIN_HOST``).

The proxy routes a server's websocket on that server's own host only, and the hub refuses a login on a user's
host (``workbench_hub/subdomains.py``): so the entry's websocket names the server's host, while the Host alias
and the token page name the hub's. JupyterHub tells the server both (``JUPYTERHUB_PUBLIC_URL``,
``JUPYTERHUB_PUBLIC_HUB_URL``); without subdomains the two share a host and the entry is what it always was.
"""

from __future__ import annotations

from workbench_ssh import handlers

SUBDOMAINS = {
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_BASE_URL": "/",
    "JUPYTERHUB_PUBLIC_URL": "https://alice.hub.example.org/user/alice/",
    "JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/hub/",
}


def test_the_websocket_is_on_the_servers_host_the_alias_and_token_page_on_the_hubs(tmp_path):
    # the page was opened at the server's own host; WORKBENCH_PUBLIC_URL, if an operator set the hub's, changes nothing
    for public in ("https://alice.hub.example.org", "https://hub.example.org"):
        info = handlers.ssh_info(public, "/user/alice/", SUBDOMAINS, str(tmp_path))
        assert info["websocket_url"] == "wss://alice.hub.example.org/user/alice/sshd/"
        assert info["alias"] == "workbench-hub.example.org-alice"
        assert info["token_page"] == "https://hub.example.org/hub/token"
        assert (
            "ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-file ~/.ssh/workbench-token "
            "wss://alice.hub.example.org/user/alice/sshd/" in info["ssh_config"]
        )


def test_a_named_server_on_subdomains(tmp_path):
    env = {
        **SUBDOMAINS,
        "JUPYTERHUB_SERVER_NAME": "big",
        "JUPYTERHUB_PUBLIC_URL": "https://alice.hub.example.org/user/alice/big/",
    }
    info = handlers.ssh_info("https://alice.hub.example.org", "/user/alice/big/", env, str(tmp_path))
    assert info["websocket_url"] == "wss://alice.hub.example.org/user/alice/big/sshd/"
    assert info["alias"] == "workbench-hub.example.org-alice+big"


def test_without_subdomains_the_entry_follows_the_address_the_page_was_opened_at(tmp_path):
    env = {
        **SUBDOMAINS,
        "JUPYTERHUB_PUBLIC_URL": "https://hub.example.org/user/alice/",
    }
    info = handlers.ssh_info("https://127.0.0.1:8443", "/user/alice/", env, str(tmp_path))
    assert info["websocket_url"] == "wss://127.0.0.1:8443/user/alice/sshd/"
    assert info["token_page"] == "https://127.0.0.1:8443/hub/token"
    assert info["alias"] == "workbench-127.0.0.1-alice"
