"""Prometheus and Grafana as shipped: the token, the scrape path and the dashboard's queries
all meet what a real hub serves."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest

from tests.service.conftest import shut_down, start_workbench_hub

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
METRIC = re.compile(r"\b(DCGM_FI_[A-Z_]+|workbench_[a-z_]+)\b")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    token = secrets.token_hex(16)
    hub = start_workbench_hub(tmp_path_factory.mktemp("hub") / "hub", {"WORKBENCH_METRICS_TOKEN": token})
    try:
        hub.create_users("alice")
        hub.spawn("alice", gpus=1)
        hub.wait_ready("alice")
        path = _scrape_config()["metrics_path"].removeprefix("/services/workbench/")
        ok = hub.service("GET", path, token=token)
        anonymous = hub.service("GET", path, token=False)
        wrong = hub.service("GET", path, token="not-a-token")
        quota_write = hub.service("PUT", "api/quotas/users/alice", token=token, json={"max_gpus": 4})
        yield ok, anonymous, wrong, quota_write
    finally:
        shut_down(hub)


def _scrape_config() -> dict:
    text = (MONITORING / "prometheus.yml").read_text()
    path = re.search(r"metrics_path:\s*(\S+)", text).group(1)
    return {"metrics_path": path, "text": text}


def test_prometheus_token_reads_metrics_and_nothing_more(scraped):
    ok, anonymous, wrong, quota_write = scraped
    assert ok.status_code == 200, ok.text
    assert ok.headers["Content-Type"].startswith("text/plain")
    assert anonymous.status_code in (302, 401, 403)
    assert wrong.status_code in (302, 401, 403)
    assert quota_write.status_code == 403, "the metrics token must not change quotas"


def test_series_carry_dcgm_labels_and_the_holder(scraped):
    body = scraped[0].text
    util = [line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(util) == 4
    for label in ("gpu=", "UUID=", "modelName=", "Hostname=", "user="):
        assert all(label in line for line in util), label
    assert any('user="alice"' in line for line in util)
    assert all('simulated="true"' in line for line in util)


def test_every_dashboard_query_uses_a_served_metric(scraped):
    served = set(METRIC.findall(scraped[0].text))
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "gpu-workbench.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    # dcgm-exporter's label is Hostname (capital H); the service serves the same.
    assert not [e for e in exprs if re.search(r"\bhostname\s*[=!]~?|, hostname\)", e)], exprs
    assert 'Hostname="' in scraped[0].text
    assert used, f"the dashboard queries metrics nobody serves: {sorted(used - served)}"
    assert used <= served, f"the dashboard queries metrics nobody serves: {sorted(used - served)}"
    datasource = (MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    uids = {p["datasource"]["uid"] for p in dashboard["panels"]}
    assert uids == {"workbench-prometheus"}
    assert "uid: workbench-prometheus" in datasource
