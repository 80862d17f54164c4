"""What both engines' fleet views and node admin share (``placement.engine_fleet``): the briefly cached node
read (``Recent``), and ``api/<engine>/nodes`` with ``workbench <engine>-nodes`` / ``-forget-node`` built from
each engine's declaration, through the real service on each engine backend (checked against the API
document): listed, forgotten by an admin only, an unknown or overlong node refused with a sentence, a silent
engine a 503."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from tests.unit.test_quota_service import PREFIX, FakeHub, settings_for
from workbench_hub.service import handlers
from workbench_hub.service.app import make_app
from workbench_hub.service.fleet import Fleet
from workbench_spawner.backend import installed_backends
from workbench_spawner.backends.kubernetes import fleet as kube_fleet
from workbench_spawner.backends.kubernetes.cluster import KubeNode
from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs
from workbench_spawner.backends.slurm.inventory import NodeGPUMap
from workbench_spawner.placement.engine_fleet import Recent
from workbench_spawner.policy.settings import store_policy_settings

# -- Recent: an engine's node list, read at most every max_age seconds ---------------------------------------


class UnansweredError(Exception):
    pass


class Engine:
    """A node list that answers ``answers`` in turn (an exception is raised), counting the reads."""

    def __init__(self, *answers):
        self.answers, self.reads = list(answers), 0

    def __call__(self):
        self.reads += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_read_is_answered_from_memory_until_it_is_max_age_old():
    now = [0.0]
    engine = Engine({"n1": 1}, {"n1": 2})
    recent = Recent(engine, max_age=2.0, clock=lambda: now[0])
    assert recent() == {"n1": 1}
    now[0] = 1.9
    assert recent() == {"n1": 1}
    assert engine.reads == 1
    now[0] = 2.0
    assert recent() == {"n1": 2}
    assert engine.reads == 2


def test_a_silent_engine_is_none_or_the_last_answer_and_asked_again_after_retry_after(caplog):
    now = [0.0]
    engine = Engine({"n1": 1}, UnansweredError("timeout"), UnansweredError("timeout"), {"n1": 3})
    recent = Recent(
        engine,
        max_age=2.0,
        unavailable=UnansweredError,
        keep=True,
        retry_after=30.0,
        clock=lambda: now[0],
        warning="w %s",
    )
    assert recent() == {"n1": 1}
    now[0] = 2.0
    with caplog.at_level(logging.WARNING, logger="workbench.service"):
        assert recent() == {"n1": 1}  # kept: a node the engine cannot tell about is not declared dead
    assert caplog.messages == ["w timeout"]
    now[0] = 31.9
    assert recent() == {"n1": 1}
    assert engine.reads == 2  # a silent engine does not hold up every caller
    now[0] = 32.0
    assert recent() == {"n1": 1}
    now[0] = 62.0
    assert recent() == {"n1": 3}

    forgetful = Recent(
        Engine(UnansweredError("down"), {"n1": 1}), max_age=2.0, unavailable=UnansweredError, retry_after=0
    )
    assert forgetful() is None
    assert forgetful() == {"n1": 1}  # asked again at once


def test_an_error_the_engine_does_not_name_as_unavailable_reaches_the_caller():
    recent = Recent(Engine(ValueError("bad answer"), {"n1": 1}), max_age=2.0, unavailable=UnansweredError)
    with pytest.raises(ValueError, match="bad answer"):
        recent()
    assert recent() == {"n1": 1}  # nothing was remembered of the failed read
    listing = Recent(Engine(UnansweredError("timeout"), {"n1": 1}), max_age=2.0)  # no error named: each reaches it
    with pytest.raises(UnansweredError):
        listing()
    assert listing() == {"n1": 1}


# -- api/<engine>/nodes through the service ----------------------------------------------------------------

SLURM_GPU = {"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 85899345920}
NODES = {"n1": KubeNode("n1", True, True, 2, 2, gpus_requested=1)}
KNOWN = {"slurm": {"gpu node": [SLURM_GPU]}, "kubernetes": {"gpu node/mig-1g.18gb": ["MIG-a"], "n1": ["GPU-b"]}}
BOOKS = {"slurm": NodeGPUMap, "kubernetes": NodeUUIDs}


@pytest.fixture
async def serve(store, monkeypatch, listen):
    """``await serve(backend)``: the service of a hub on that backend, with ``call`` reaching it."""
    monkeypatch.setattr(kube_fleet, "kube_nodes", lambda: NODES)
    caller = {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]}
    monkeypatch.setattr(handlers.WorkbenchHandler, "get_current_user", lambda self: caller)
    client = AsyncHTTPClient()

    async def start(backend: str):
        store_policy_settings(store, settings_for(store.url))
        BOOKS[backend](store).update(lambda known: known.update(KNOWN[backend]) is None)
        app = make_app(Fleet(store, refresh_seconds=0), FakeHub(), PREFIX, backend=backend)
        doc = app.settings["openapi"]
        port = listen(app)

        async def call(method: str, path: str) -> tuple[int, dict | None]:
            r = await client.fetch(f"http://127.0.0.1:{port}{PREFIX}{path}", method=method, raise_error=False)
            check(doc, method, path, r.code, r.headers.get("Content-Type", ""), r.body)
            return r.code, json.loads(r.body) if r.body else None

        call.caller = caller  # type: ignore[attr-defined]
        return call

    return start


async def test_slurm_lists_the_gpus_jobs_reported_per_node(serve):
    call = await serve("slurm")
    assert await call("GET", "api/slurm/nodes") == (200, {"nodes": [{"node": "gpu node", "gpus": [SLURM_GPU]}]})


async def test_kubernetes_lists_each_gpu_node_with_the_uuids_pods_reported(serve, monkeypatch):
    call = await serve("kubernetes")
    code, listing = await call("GET", "api/kubernetes/nodes")
    assert code == 200
    # "gpu node" (its MIG slices' UUIDs) is a node the API does not list
    assert listing["nodes"] == [kube_fleet.node_rows(KNOWN["kubernetes"])[0]]
    assert listing["nodes"][0]["reported_uuids"] == ["GPU-b"]
    monkeypatch.setattr(kube_fleet, "kube_nodes", lambda: None)
    code, error = await call("GET", "api/kubernetes/nodes")
    assert code == 503
    assert error["message"] == "the Kubernetes API did not answer; the hub's log says why"


@pytest.mark.parametrize(
    ("backend", "limit", "unknown"),
    [
        (
            "slurm",
            255,
            'the hub knows nothing about the GPUs of a node named "gpu07"; `workbench slurm-nodes` lists the nodes '
            "it knows",
        ),
        (
            "kubernetes",
            253,
            'the hub knows no GPU UUIDs of a node named "gpu07"; `workbench kubernetes-nodes` lists the nodes',
        ),
    ],
)
async def test_only_an_admin_forgets_a_node_and_an_unknown_or_overlong_one_is_refused(
    serve, store, backend, limit, unknown
):
    call = await serve(backend)
    route = f"api/{backend}/nodes/"
    assert await call("DELETE", route + "gpu07") == (404, {"status": 404, "message": unknown})
    code, error = await call("DELETE", route + "n" * (limit + 1))
    assert (code, error["message"]) == (400, f"a node name has at most {limit} characters")
    call.caller["scopes"] = [handlers.READ_SCOPE]
    code, error = await call("DELETE", route + "gpu%20node")
    assert code == 403
    assert error["message"].startswith("only hub admins may make the hub forget a node's GPUs")
    call.caller["scopes"] = [handlers.ADMIN_SCOPE]
    assert await call("DELETE", route + "gpu%20node") == (204, None)  # the node and its sub-keys
    assert BOOKS[backend](store).known() == {k: v for k, v in KNOWN[backend].items() if k.startswith("n1")}


# -- workbench <engine>-nodes / <engine>-forget-node ----------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "row", "listed", "none", "forgot"),
    [
        (
            "slurm",
            {"node": "gpu07", "gpus": [SLURM_GPU, {**SLURM_GPU, "index": 1, "uuid": "GPU-b"}]},
            "gpu07:0 GPU-a NVIDIA H100 80GB HBM3\ngpu07:1 GPU-b NVIDIA H100 80GB HBM3",
            "no GPU reported by a Slurm job yet",
            "The hub forgot the GPUs of gpu node/1; the next job there names them again.",
        ),
        (
            "kubernetes",
            {"node": "gpu07", "ready": True, "schedulable": False, "gpus_requested": 1, "gpu_allocatable": 2}
            | {"reported_uuids": []},
            "gpu07: 1/2 GPU(s) requested (not schedulable); reported: none yet",
            "no node advertises GPUs",
            "The hub forgot the GPU UUIDs of gpu node/1; the next pod there names them again.",
        ),
    ],
)
def test_the_cli_lists_and_forgets_through_the_service(backend, row, listed, none, forgot):
    cli = installed_backends()[backend].cli
    assert cli is not None
    assert cli.names == (f"{backend}-nodes", f"{backend}-forget-node")
    parser = argparse.ArgumentParser()
    cli.add_parsers(parser.add_subparsers(dest="area"))
    calls: list[tuple[str, str]] = []
    answers = [{"nodes": [row]}, {"nodes": []}]

    def call(url, token, method, path):
        calls.append((method, path))
        return answers.pop(0) if method == "GET" else None

    listing = parser.parse_args([f"{backend}-nodes"])
    listing.url, listing.token = "http://hub/", "t"
    assert cli.run(listing, call) == ({"nodes": [row]}, listed)
    assert cli.run(listing, call) == ({"nodes": []}, none)
    forget = parser.parse_args([f"{backend}-forget-node", "gpu node/1"])
    forget.url, forget.token = "http://hub/", "t"
    assert cli.run(forget, call) == (None, forgot)
    assert calls == [
        ("GET", f"api/{backend}/nodes"),
        ("GET", f"api/{backend}/nodes"),
        ("DELETE", f"api/{backend}/nodes/gpu%20node%2F1"),  # the name is one path segment
    ]
