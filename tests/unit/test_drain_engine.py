"""Drains where an engine places servers (Slurm, Kubernetes): only the hub's own placement reads them.

The published settings say which placement the hub runs (``placement``, "host" for rows stored before
it existed); on "engine" the service refuses PUT api/drains with 409 and the engine's own command,
stores nothing, still lists and removes a drain stored before, the CLI says the same and exits 1,
and the fleet page offers no Drain button but one line saying where to drain instead."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from tests.unit.fake_backends import FakeEngineSpawner
from tests.unit.test_drain import H100, H200, MIXED, SLICES
from tests.unit.test_quota_service import PREFIX, FakeHub, service_document
from tests.unit.test_settings import config
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_hub.service import handlers
from workbench_hub.service.app import make_app
from workbench_hub.service.fleet import Fleet
from workbench_spawner.ledger.drain_book import DrainBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import (
    PolicySettings,
    load_policy_settings,
    publish_policy_settings,
    store_policy_settings,
)
from workbench_spawner.rules.quota import Quota

NODE = "gpu-node-7"
# What each engine's refusal must tell the admin to run instead, on the GPU's own node.
ENGINE_WORDS = {
    "slurm": [
        "this hub runs on Slurm",
        f'`scontrol update NodeName={NODE} State=DRAIN Reason="..."`',
        f"`scontrol update NodeName={NODE} State=RESUME` after",
    ],
    "kubernetes": ["this hub runs on Kubernetes", f"`kubectl cordon {NODE}`", f"`kubectl uncordon {NODE}` after"],
}
PAGE_LINES = {  # as the page escapes them
    "slurm": "Slurm places servers on GPUs here: drain a node in Slurm "
    "(scontrol update NodeName=&lt;node&gt; State=DRAIN Reason=&#34;...&#34;).",
    "kubernetes": "Kubernetes places servers on GPUs here: cordon a node in Kubernetes (kubectl cordon &lt;node&gt;).",
}


def engine_settings(url: str, backend: str, placement: str = "engine") -> PolicySettings:
    """A cluster's inventory (every device on NODE), as an engine backend publishes it."""
    devices = [replace(d, node=NODE) for d in parse_simulated_spec(MIXED)]
    return PolicySettings(
        url,
        DeviceInventory("simulated", devices, "test"),
        default_quota=Quota(1),
        node="",
        backend=backend,
        placement=placement,
    )


# -- the setting --------------------------------------------------------------------------------------------


def test_placement_survives_the_stored_row_and_an_old_row_reads_as_host(store):
    settings = engine_settings(store.url, "kubernetes")
    data = json.loads(json.dumps(settings.to_json()))
    assert data["placement"] == "engine"
    assert PolicySettings.from_json(data, store.url).placement == "engine"
    store_policy_settings(store, settings)
    assert load_policy_settings(store)[0].placement == "engine"
    old = {k: v for k, v in data.items() if k != "placement"}  # written by a hub before the field existed
    assert PolicySettings.from_json(old, store.url).placement == "host"


@pytest.mark.parametrize(("spawner", "placement"), [(FakeEngineSpawner, "engine"), (None, "host")])
def test_the_hub_publishes_its_spawner_class_placement(tmp_path, spawner, placement):
    published = publish_policy_settings(config(tmp_path, "gpu-local"), spawner)
    assert published.placement == placement
    store = AllocationStore(published.db_url)
    try:
        assert load_policy_settings(store)[0].placement == placement
    finally:
        store.dispose()


# -- the service, its CLI and its page ------------------------------------------------------------------------


class PageHub(FakeHub):
    """The hub's API as the page asks it: no users, no groups."""

    async def users(self) -> list[dict]:
        return []

    async def groups(self) -> list[dict]:
        return []


@pytest.fixture
async def serve(store, monkeypatch, listen):
    """``await serve(backend, placement)``: a service on settings so published; ``call`` and ``page`` reach it."""
    from workbench_spawner.backends.kubernetes import fleet as kube_fleet
    from workbench_spawner.backends.slurm import fleet as slurm_fleet

    monkeypatch.setattr(slurm_fleet, "slurm_nodes", lambda *a, **k: None)  # no controller to ask here
    monkeypatch.setattr(kube_fleet, "kube_nodes", lambda *a, **k: None)
    caller = {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]}
    monkeypatch.setattr(handlers.WorkbenchHandler, "get_current_user", lambda self: caller)
    doc = service_document()
    client = AsyncHTTPClient()

    async def start(backend: str, placement: str = "engine"):
        store_policy_settings(store, engine_settings(store.url, backend, placement))
        port = listen(make_app(Fleet(store, refresh_seconds=0), PageHub(), PREFIX))

        async def call(method: str, path: str, body=None) -> tuple[int, dict | None]:
            data = "" if method == "PUT" and body is None else (None if body is None else json.dumps(body))
            url = f"http://127.0.0.1:{port}{PREFIX}{path}"
            r = await client.fetch(url, method=method, body=data, raise_error=False)
            check(doc, method, path, r.code, r.headers.get("Content-Type", ""), r.body)
            return r.code, json.loads(r.body) if r.body else None

        async def page() -> str:
            r = await client.fetch(f"http://127.0.0.1:{port}{PREFIX}", raise_error=False)
            assert r.code == 200, r.body[:300]
            return r.body.decode()

        call.page = page  # type: ignore[attr-defined]
        call.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        call.caller = caller  # type: ignore[attr-defined]
        return call

    return start


@pytest.mark.parametrize("backend", ["slurm", "kubernetes"])
async def test_an_engine_hub_refuses_a_drain_with_the_engines_command_and_stores_nothing(serve, store, backend):
    call = await serve(backend)
    for name in ("1", H100, H200, SLICES[3]):
        code, error = await call("PUT", f"api/drains/{name}", {"reason": "new MIG layout"})
        assert code == 409, error
        message = error["message"]
        for words in ENGINE_WORDS[backend]:
            assert words in message, message
        assert "nothing was drained" in message
        assert "A MIG layout change needs all the node's GPUs idle" in message
    # A name that is no GPU of this hub is refused as well, with the node left for the admin to fill in.
    code, error = await call("PUT", "api/drains/GPU-nope")
    assert code == 409
    assert "NodeName=<node>" in error["message"] or "cordon <node>" in error["message"]
    assert DrainBook(store).drained() == set()
    assert await call("GET", "api/drains") == (200, {"drains": []})
    call.caller["scopes"] = [handlers.READ_SCOPE]  # who may not drain is told so first
    code, error = await call("PUT", "api/drains/1")
    assert code == 403
    assert error["message"].startswith("only hub admins may drain GPUs")


@pytest.mark.parametrize("backend", ["slurm", "kubernetes"])
async def test_a_drain_stored_before_the_hub_moved_to_an_engine_can_still_be_listed_and_removed(serve, store, backend):
    DrainBook(store).drain([H200, H100], "stored on the docker backend")
    call = await serve(backend)
    code, listing = await call("GET", "api/drains")
    assert code == 200
    assert [d["gpu_uuid"] for d in listing["drains"]] == [H200, H100]
    assert await call("DELETE", f"api/drains/{H100}") == (204, None)
    assert await call("DELETE", "api/drains/0") == (204, None)  # the H200 by its index
    assert DrainBook(store).drained() == set()


async def test_the_cli_shows_the_refusal_and_exits_1_on_an_engine(serve, store, capsys):
    from workbench_hub.cli import main

    call = await serve("slurm")
    base = ["--url", call.url, "--token", "t"]
    assert await asyncio.to_thread(main, [*base, "drain", "1", "--reason", "2x3g.71gb"]) == 1
    err = capsys.readouterr().err
    assert "(409): this hub runs on Slurm" in err
    assert f"scontrol update NodeName={NODE} State=DRAIN" in err
    assert DrainBook(store).drained() == set()
    DrainBook(store).drain([H100])
    assert await asyncio.to_thread(main, [*base, "undrain", "1"]) == 0
    assert DrainBook(store).drained() == set()


@pytest.mark.parametrize("backend", ["slurm", "kubernetes"])
async def test_the_page_of_an_engine_hub_offers_no_drain_but_says_where(serve, store, backend):
    DrainBook(store).drain([H100], "stored before")
    call = await serve(backend)
    html = await call.page()
    assert f'<p class="small text-muted mb-0" id="drain-elsewhere">{PAGE_LINES[backend]}</p>' in html
    assert 'wb-drain-button"' not in html, "no Drain or Undrain button on any GPU"
    # The drain stored before closes nothing here: not shown as draining, and api/gpus gives its free slot.
    assert "draining: no new servers</span>" not in html
    code, listing = await call("GET", "api/gpus")
    rows = listing["gpus"] if isinstance(listing, dict) else listing
    h100 = next(g for g in rows if g["uuid"] == H100)
    assert code == 200
    assert (h100["drained"], h100["free_slots"]) == (False, 1)


async def test_the_page_of_a_host_hub_still_offers_drain(serve, store):
    call = await serve("docker", "host")
    html = await call.page()
    assert f'data-gpu="{H200}" data-drained="false">Drain GPU</button>' in html
    assert f'data-gpu="{H100}" data-drained="false">Drain</button>' in html
    assert 'id="drain-elsewhere"' not in html
    assert (await call("PUT", f"api/drains/{H100}"))[0] == 200
    assert DrainBook(store).drained() == {H100}


def test_every_engine_backend_says_how_its_engine_drains_a_node():
    """The contract: a backend whose engine places servers names its engine's drain (``NodeDrain``), so the
    refusal gives a command to run; an engine a site adds without one gets a general sentence."""
    from importlib.metadata import entry_points

    from workbench_spawner.backend import installed_backends, node_drain_of

    spawners = {p.name: p for p in entry_points(group="jupyterhub.spawners")}
    engines = [n for n, ext in installed_backends().items() if spawners[ext.spawner].load().placement_mode == "engine"]
    assert engines == ["kubernetes", "slurm"]
    assert all(installed_backends()[n].node_drain is not None for n in engines)
    assert node_drain_of("acme").refusal("n1") == (
        "this hub runs on the acme engine, which places servers on GPUs itself and does not read workbench drains, "
        "so nothing was drained; close the node in the acme engine instead. A MIG layout change needs all the "
        "node's GPUs idle: wait until its servers have ended."
    )
    assert (
        node_drain_of("acme").line() == "The acme engine places servers on GPUs here: close a node in the acme engine."
    )
