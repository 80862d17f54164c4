"""GPU Workbench SSH: OpenSSH into your own server, through the hub's proxy.

* ``workbench-sshd`` (``sshd.py``): the sshd that jupyter-server-proxy starts on
  the raw-socket websocket ``{base_url}sshd/``; jupyter-sshd-proxy's command,
  hardened (public keys only, no root, this user only, the server's GPU
  variables in every session);
* ``session.sh``: sshd's ForceCommand, which puts every session in the server's home;
* ``keys.py``: validating and adding a public key to ``~/.ssh/authorized_keys``;
* ``client_config.py``: the ``~/.ssh/config`` entry a user pastes on a laptop;
* ``proxy.py``: that entry's ProxyCommand, one file the page serves for the laptop;
* ``handlers.py``: the page ``{base_url}workbench/ssh`` and
  ``{base_url}api/workbench/ssh/keys``.

JupyterLab's launcher shows "SSH into this server" (category Other), which opens
the page: jupyter-server-proxy's launcher entry of the ``sshd`` server, pointed
at the page rather than at the raw websocket.
"""

import sys
from pathlib import Path

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "workbench_ssh"}]


#: jupyter-server-proxy's entry for the SSH endpoint; it takes the place of
#: jupyter-sshd-proxy's own ``sshd`` entry point (configured servers come first
#: in server-proxy's handler list, and the first matching handler serves).
SSHD_SERVER = {
    # this interpreter, not a PATH lookup: the local backend's PATH may lack the venv
    "command": [sys.executable, "-m", "workbench_ssh.sshd", "{port}"],
    "raw_socket_proxy": True,
    "timeout": 30,
    # the launcher item opens the SSH page (in a new browser tab); it does not start sshd
    "launcher_entry": {
        "enabled": True,
        "title": "SSH into this server",
        "path_info": "workbench/ssh",
        "category": "Other",
        "icon_path": str(Path(__file__).with_name("ssh-icon.svg")),
    },
}


def _link_jupyter_server_extension(serverapp):
    # Linking runs for every extension before any is loaded, so jupyter-server-proxy
    # finds this entry when it reads ServerProxy.servers at its own load.
    servers = dict(serverapp.config.ServerProxy.get("servers", {}))
    servers["sshd"] = SSHD_SERVER
    serverapp.config.ServerProxy.servers = servers


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("workbench_ssh: SSH page at %sworkbench/ssh", serverapp.base_url)
