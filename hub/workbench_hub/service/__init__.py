"""The workbench service: GPU quotas, the fleet view and metrics, for hub admins.

JupyterHub starts it as a managed service at ``/services/workbench/`` (see the
``# -- the workbench service`` block of ``hub/jupyterhub_config.py``)::

    python -m workbench_hub.service --port=10101 --db-url=sqlite:////srv/data/workbench.sqlite

It serves

* an admin page (server-rendered, the hub's Bootstrap, a little JavaScript for
  live numbers): every GPU with its holder and live use, every user and group
  with the effective quota and where it comes from, GPU-hours this week, and
  forms to set or delete quotas;
* a REST API (``api/gpus``, ``api/allocations``, ``api/quotas/...``,
  ``api/usage``), described by ``api/openapi.json``;
* ``metrics``: Prometheus text with DCGM-exporter names.

The hub passes the GPU database's URL and its backend's name (whose routes
and OpenAPI fragment the backend's ``workbench.backends`` extension adds;
this package imports no backend); the policy's settings
(inventory, servers per GPU, default quota, node) are the ones the hub
stored there at start, never re-derived here. One job per module:

* ``app``: the command line and the tornado application;
* ``lifetime``: a busy port, SIGINT/SIGTERM, ending with the hub;
* ``fleet``: the stored settings, leases, live readings, quota summaries;
* ``hub_client``: the hub REST calls (users, groups, stopping a server);
* ``session_limits``: stopping servers past their session length;
* ``handlers``: the REST API; ``page_handlers``: the fleet page and My
  GPUs (``my_gpus``: a user's own quota, GPU-hours, servers and stops, and
  ``api/me``); ``openapi.yaml``: their one document (``openapi``: loads it,
  merges the backend's fragment, checks request bodies against it);
* ``headers``: the security headers of every answer; ``access_log``: log
  lines with the tokens in URLs hidden;
* ``metrics``: Prometheus text.

Who may do what is decided here, on every request, from the caller's hub
scopes (``scopes``): ``custom:workbench:admin`` reads and writes everything,
``custom:workbench:read`` reads everything, and ``custom:workbench:self``,
which the hub's ``user`` role gives every user, a user's own data. It
shares the workbench database with the spawner, so a quota saved here
applies to the next spawn; running servers are never touched by a quota
change. The one thing it stops is a server that outlives the session
length its quota had when it started (``max_session_hours``).
"""
