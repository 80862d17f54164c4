"""The engines' start-report routes: added through ``c.JupyterHub.extra_handlers``, served where they were.

JupyterHub prefixes ``extra_handlers`` with its hub prefix as it does its own API, so the address a
server posts its report to (``/hub/api/batchspawner``, ``/hub/api/workbench/start-report``) is unchanged;
batchspawner's own handler (appended to JupyterHub's global list when batchspawner is imported) is taken
out, so it never answers in place of ours.
"""

from __future__ import annotations

import re

import pytest
from jupyterhub import apihandlers
from jupyterhub.app import JupyterHub
from jupyterhub.auth import Authenticator
from traitlets.config import Config

from workbench_spawner.backend import installed_backends
from workbench_spawner.backends.kubernetes.report_api import PodReportHandler
from workbench_spawner.backends.slurm.report_api import StartReportHandler
from workbench_spawner.placement.engine_extension import add_hub_route


@pytest.fixture(autouse=True)
def own_handler_list(monkeypatch):
    """Each test sees (and may change) its own copy of JupyterHub's global API handler list."""
    monkeypatch.setattr(apihandlers, "default_handlers", list(apihandlers.default_handlers))


def served_by(c: Config, path: str) -> type | None:
    """The handler JupyterHub routes ``path`` to with config ``c``: the first route that matches, as tornado."""
    app = JupyterHub(config=c)
    app.authenticator = Authenticator()
    app.init_handlers()
    for route in app.handlers:
        if re.fullmatch(route[0], path):
            return route[1]
    return None


def test_kubernetes_adds_its_route_to_the_config_once_and_not_to_jupyterhubs_list():
    before = list(apihandlers.default_handlers)
    c = Config()
    setup = installed_backends()["kubernetes"].setup_hub
    setup(c)
    setup(c)
    assert c.JupyterHub.extra_handlers == [("/api/workbench/start-report", PodReportHandler)]
    assert apihandlers.default_handlers == before
    assert served_by(c, "/hub/api/workbench/start-report") is PodReportHandler


def test_the_slurm_report_is_served_at_batchspawners_address_in_place_of_batchspawners_handler():
    from batchspawner.api import BatchSpawnerAPIHandler

    c = Config()
    c.JupyterHub.base_url = "/jh/"
    installed_backends()["slurm"].setup_hub(c)
    assert c.JupyterHub.extra_handlers == [("/api/batchspawner", StartReportHandler)]
    assert not [h for h in apihandlers.default_handlers if h[1] is BatchSpawnerAPIHandler]
    assert served_by(c, "/jh/hub/api/batchspawner") is StartReportHandler


def test_batchspawners_handler_would_answer_first_if_it_stayed():
    """Why the Slurm backend takes batchspawner's entry out: JupyterHub routes its list before extra_handlers."""
    from batchspawner.api import BatchSpawnerAPIHandler

    c = Config()
    add_hub_route(c, "/api/batchspawner", StartReportHandler)
    if not [h for h in apihandlers.default_handlers if h[1] is BatchSpawnerAPIHandler]:
        apihandlers.default_handlers.append(("/api/batchspawner", BatchSpawnerAPIHandler))
    assert served_by(c, "/hub/api/batchspawner") is BatchSpawnerAPIHandler


def test_a_sites_own_extra_handlers_stay():
    class Mine:
        pass

    c = Config()
    c.JupyterHub.extra_handlers.append(("/api/mine", Mine))  # a LazyConfigValue until JupyterHub reads it
    add_hub_route(c, "/api/workbench/start-report", PodReportHandler)
    add_hub_route(c, "/api/workbench/start-report", PodReportHandler)
    assert c.JupyterHub.extra_handlers == [("/api/mine", Mine), ("/api/workbench/start-report", PodReportHandler)]
