"""GPU Workbench SSH: OpenSSH into your own server, through the hub's proxy.

* ``workbench-sshd`` (``sshd.py``): the sshd that jupyter-server-proxy starts on
  the raw-socket websocket ``{base_url}sshd/``; jupyter-sshd-proxy's command,
  hardened (public keys only, no root, this user only, the server's GPU
  variables in every session);
* ``keys.py``: validating and adding a public key to ``~/.ssh/authorized_keys``;
* ``client_config.py``: the ``~/.ssh/config`` entry a user pastes on a laptop;
* ``handlers.py``: the page ``{base_url}workbench/ssh`` and
  ``{base_url}api/workbench/ssh/keys``.
"""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "workbench_ssh"}]


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("workbench_ssh: SSH page at %sworkbench/ssh", serverapp.base_url)
