"""Drained GPUs (issue 25): an admin closes a GPU to new servers to change its MIG layout safely.

The table and its book; what a name means (UUID, a MIG GPU with its slices, one slice, an index);
placement that never leases a drained device, not even to a request already waiting in line;
the spawn form; the service's api/drains and api/gpus, held to the OpenAPI document; the CLI;
and the admin page's button."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import UTC, datetime
from importlib.resources import files

import pytest
import sqlalchemy as sa
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from tests.unit.test_quota_service import PREFIX, FakeHub, _free_port, service_document
from tests.unit.test_quota_spawn import make_spawner as make_spawner  # the fixture, for pytest to find
from workbench_devices import DeviceInventory, discover_devices, parse_simulated_spec
from workbench_hub.service import handlers
from workbench_hub.service.app import make_app
from workbench_hub.service.fleet import Fleet
from workbench_hub.service.handlers import _jinja
from workbench_spawner.ledger.drain_book import AmbiguousGPUError, DrainBook, UnknownGPUError, resolve_gpu
from workbench_spawner.ledger.migrations import HEAD, current, downgrade, upgrade
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy, NoGPUAvailableError
from workbench_spawner.policy.settings import PolicySettings, store_policy_settings
from workbench_spawner.rules.quota import Quota

MIXED = "1xH200-141GB:mig=7x1g.18gb,1xH100-80GB"
H200 = "GPU-sim-00-h200-141gb"  # in MIG mode: no device itself, the parent of seven slices
H100 = "GPU-sim-01-h100-80gb"
SLICES = [f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(7)]


def make_policy(store: AllocationStore, spec: str = MIXED, recheck: float = 0.05) -> GPUPolicy:
    settings = PolicySettings(store.url, DeviceInventory("simulated", parse_simulated_spec(spec), "test"), node="n")
    return GPUPolicy(settings, store, recheck_interval=recheck)


# -- the table ------------------------------------------------------------------------------------------


def test_the_migration_makes_the_table_and_its_downgrade_drops_it(store):
    assert current(store.engine) == HEAD
    inspector = sa.inspect(store.engine)
    assert {c["name"] for c in inspector.get_columns("gpu_drains")} == {
        "id",
        "gpu_uuid",
        "reason",
        "drained_by",
        "since",
    }
    assert [u["column_names"] for u in inspector.get_unique_constraints("gpu_drains")] == [["gpu_uuid"]]

    downgrade(store.engine, "0004")
    assert not sa.inspect(store.engine).has_table("gpu_drains")
    upgrade(store.engine)  # a database at 0004 gets the table
    assert sa.inspect(store.engine).has_table("gpu_drains")
    assert current(store.engine) == HEAD


def test_drain_undrain_and_what_is_listed(store):
    book = DrainBook(store)
    assert book.drained() == set()
    assert book.rows() == []
    first = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    (drain,) = book.drain([H200], "new layout", "user:admin", now=first)
    assert (drain.gpu_uuid, drain.reason, drain.drained_by, drain.since) == (H200, "new layout", "user:admin", first)
    # Draining again keeps since and who; a new reason replaces the old, an empty one does not.
    book.drain([H200, H100], "", "user:other")
    book.drain([H200], "2x3g.71gb", "user:other")
    rows = {r.gpu_uuid: r for r in book.rows()}
    assert rows[H200].since == first
    assert rows[H200].drained_by == "user:admin"
    assert rows[H200].reason == "2x3g.71gb"
    assert rows[H100].reason == ""
    assert rows[H100].drained_by == "user:other"
    assert book.drained() == {H200, H100}
    other = AllocationStore(store.url)  # another process: the hub's placement, the service
    assert DrainBook(other).drained() == {H200, H100}
    other.dispose()
    assert book.undrain([H100, "GPU-never"]) == [H100]
    assert book.undrain([H100]) == []
    assert book.drained() == {H200}
    assert rows[H200].to_json()["since"] == first.isoformat()


def test_a_name_is_a_gpu_with_its_slices_one_slice_or_an_index():
    devices = parse_simulated_spec(MIXED)
    assert resolve_gpu(H200, devices).devices == tuple(SLICES)
    assert resolve_gpu(" gpu-sim-00-H200-141gb ", devices).gpu_uuid == H200  # case and spaces do not matter
    assert resolve_gpu("0", devices) == resolve_gpu(H200, devices)  # the slices carry their GPU's index
    assert resolve_gpu("1", devices).devices == (H100,)
    assert resolve_gpu(H100, devices).gpu_uuid == H100
    assert resolve_gpu(SLICES[3], devices).devices == (SLICES[3],)
    for name in ("GPU-nope", "7", "", "-1"):
        with pytest.raises(UnknownGPUError, match="this hub has no GPU or MIG slice named"):
            resolve_gpu(name, devices)
    two_nodes = [replace(d, node=n) for n in ("a", "b") for d in parse_simulated_spec("1xH100-80GB", node=n)]
    with pytest.raises(AmbiguousGPUError, match=r"GPU index 0 is on several nodes \(a, b\); name the GPU by its UUID"):
        resolve_gpu("0", two_nodes)


# -- placement --------------------------------------------------------------------------------------------


async def test_a_drained_gpu_is_never_leased_while_the_others_are(store):
    policy = make_policy(store, "3xH100-80GB")
    drained = policy.devices[1].uuid
    DrainBook(store).drain([drained])
    leases = [await policy.place(user, "", 1, None, 1) for user in ("a", "b")]
    assert drained not in {u for lease in leases for u in lease.gpu_uuids}
    assert policy.placement.free_count() == 0
    assert policy.free_count() == 0
    with pytest.raises(NoGPUAvailableError, match=r"\(0 free now"):
        await policy.place("c", "", 1, None, 0.3)
    DrainBook(store).undrain([drained])
    assert (await policy.place("c", "", 1, None, 1)).gpu_uuids == (drained,)


async def test_a_request_waiting_in_line_is_not_given_a_gpu_drained_after_it_joined(store):
    policy = make_policy(store)
    await policy.place("holder", "", 1, None, 1)  # the one whole GPU: the H100
    waiter = asyncio.create_task(policy.place("waiter", "", 1, None, 1.0))
    await asyncio.sleep(0.2)
    assert policy.placement.waiting() == 1
    DrainBook(store).drain([H100], "new layout")
    policy.release("holder", "", "stopped")
    with pytest.raises(NoGPUAvailableError):
        await waiter
    assert [lease.user for lease in store.leases()] == []
    DrainBook(store).undrain([H100])
    assert (await policy.place("waiter", "", 1, None, 1)).gpu_uuids == (H100,)


async def test_draining_a_gpu_drains_its_slices_and_a_slice_alone_only_itself(store):
    policy = make_policy(store)
    book = DrainBook(store)
    book.drain([resolve_gpu("0", policy.devices).gpu_uuid])  # the H200 by its index: all seven slices
    assert book.drained() == {H200}
    with pytest.raises(NoGPUAvailableError):
        await policy.place("student", "", 1, "1g.18gb", 0.2)
    assert (await policy.place("research", "", 1, None, 1)).gpu_uuids == (H100,)  # the whole GPU is not drained
    status = {s.device.uuid: s for s in policy.status()}
    assert all(status[u].drained and status[u].free_slots == 0 for u in SLICES)
    assert status[H100].drained is False
    book.undrain([H200])
    book.drain([SLICES[0]])
    lease = await policy.place("student", "", 1, "1g.18gb", 1)
    assert lease.gpu_uuids == (SLICES[1],)
    assert policy.placement.free_count("1g.18gb") == 5
    assert policy.free_count("1g.18gb") == 5


async def test_the_spawn_form_says_draining(make_spawner):
    spawner = make_spawner(simulated_gpus=MIXED)
    DrainBook(spawner.gpu_policy.store).drain([H100])
    html = await spawner._render_options_form()
    assert "<td>draining (no new servers)</td>" in html
    assert '<option value="">Whole GPUs: 0 of 1 free</option>' in html


# -- the service ------------------------------------------------------------------------------------------


@pytest.fixture
async def service(store, monkeypatch):
    caller = {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]}
    monkeypatch.setattr(handlers.WorkbenchHandler, "get_current_user", lambda self: caller)
    store_policy_settings(
        store, PolicySettings(store.url, discover_devices(MIXED), default_quota=Quota(1), node="gpu-node-7")
    )
    port = _free_port()
    server = make_app(Fleet(store, refresh_seconds=0), FakeHub(), PREFIX).listen(port, "127.0.0.1")
    doc = service_document()
    client = AsyncHTTPClient()

    async def call(method: str, path: str, body=None) -> tuple[int, dict | None]:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        if method == "PUT" and data is None:
            data = ""
        r = await client.fetch(f"http://127.0.0.1:{port}{PREFIX}{path}", method=method, body=data, raise_error=False)
        check(doc, method, path, r.code, r.headers.get("Content-Type", ""), r.body)
        return r.code, json.loads(r.body) if r.body else None

    call.caller = caller  # type: ignore[attr-defined]  (a test may take the admin scope away)
    call.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]  (the hub's URL, as the CLI takes it)
    try:
        yield call
    finally:
        server.stop()


async def test_the_api_drains_lists_and_undrains(service, store):
    store.allocate("alice", "", 1, [SLICES[2]])
    code, drain = await service("PUT", "api/drains/0", {"reason": "new layout"})
    assert code == 200, drain
    assert (drain["gpu_uuid"], drain["devices"], drain["reason"]) == (H200, SLICES, "new layout")
    assert drain["drained_by"] == "user:admin"
    assert drain["holders"] == [{"uuid": SLICES[2], "user": "alice", "server": "", "stop_at": None}]
    code, again = await service("PUT", f"api/drains/{H100}")  # no body at all
    assert code == 200
    assert again["devices"] == [H100]
    assert again["holders"] == []
    assert again["reason"] == ""
    code, listing = await service("GET", "api/drains")
    assert [d["gpu_uuid"] for d in listing["drains"]] == [H200, H100]
    code, inventory = await service("GET", "api/gpus")
    assert {g["uuid"]: (g["drained"], g["free_slots"]) for g in inventory["gpus"]} == {
        **{u: (True, 0) for u in SLICES},
        H100: (True, 0),
    }
    assert await service("DELETE", f"api/drains/{H100}") == (204, None)
    code, inventory = await service("GET", "api/gpus")
    assert {g["uuid"]: (g["drained"], g["free_slots"]) for g in inventory["gpus"]}[H100] == (False, 1)
    assert DrainBook(store).drained() == {H200}


async def test_the_api_refuses_in_sentences(service, store):
    code, error = await service("PUT", "api/drains/GPU-nope")
    assert code == 404
    assert error["message"] == (
        'this hub has no GPU or MIG slice named "GPU-nope"; the fleet page (/services/workbench/) '
        "or GET api/gpus lists each GPU's index and UUID"
    )
    code, error = await service("DELETE", "api/drains/1")
    assert code == 404
    assert error["message"] == f"{H100} is not drained; GET api/drains lists what is"
    code, error = await service("PUT", "api/drains/1", {"why": "x"})
    assert code == 400
    assert error["message"] == ("invalid drain: unknown field 'why'; a drain has reason and stop_servers_in_minutes")
    code, error = await service("PUT", "api/drains/1", "{")
    assert code == 400
    assert "not valid JSON" in error["message"]
    # A slice of a GPU drained as a whole is opened with its GPU, not alone.
    assert (await service("PUT", f"api/drains/{H200}"))[0] == 200
    code, error = await service("DELETE", f"api/drains/{SLICES[0]}")
    assert code == 409
    assert error["message"] == (
        f"{SLICES[0]} is a slice of {H200}, which is drained as a whole; undrain that GPU to open all its slices"
    )
    # A drain of a device no longer on this hub may still be ended.
    DrainBook(store).drain(["MIG-gone-0"])
    assert await service("DELETE", "api/drains/MIG-gone-0") == (204, None)
    service.caller["scopes"] = [handlers.READ_SCOPE]
    code, error = await service("PUT", "api/drains/1")
    assert code == 403
    assert error["message"].startswith("only hub admins may drain GPUs")
    assert (await service("GET", "api/drains"))[0] == 200
    assert DrainBook(store).drained() == {H200}


# -- the CLI and the admin page -----------------------------------------------------------------------------


async def test_the_cli_drains_lists_and_undrains(service, store, capsys):
    from workbench_hub.cli import main

    base = ["--url", service.url, "--token", "t"]
    store.allocate("alice", "lab", 1, [SLICES[4]])
    assert await asyncio.to_thread(main, [*base, "drain", "0", "--reason", "2x3g.71gb"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Drained {H200} (7 MIG slices): no new server gets it; still in use by alice/lab;")
    assert DrainBook(store).drained() == {H200}
    assert await asyncio.to_thread(main, [*base, "drains"]) == 0
    assert "by user:admin (2x3g.71gb); still in use by alice/lab" in capsys.readouterr().out
    store.release("alice", "lab")
    assert await asyncio.to_thread(main, [*base, "drains"]) == 0
    assert "nothing runs there: its layout may change now" in capsys.readouterr().out
    assert await asyncio.to_thread(main, [*base, "undrain", "0"]) == 0
    assert capsys.readouterr().out == "Undrained 0: new servers may get it again.\n"
    assert DrainBook(store).drained() == set()
    assert await asyncio.to_thread(main, [*base, "drains"]) == 0
    assert capsys.readouterr().out == "no GPU is drained\n"
    # A GPU the hub does not have, or one not drained, is a bad command line: exit code 2 and the sentence.
    assert await asyncio.to_thread(main, [*base, "drain", "GPU-nope"]) == 2
    assert "this hub has no GPU or MIG slice named" in capsys.readouterr().err
    assert await asyncio.to_thread(main, [*base, "undrain", "1"]) == 2
    assert f"{H100} is not drained" in capsys.readouterr().err


def test_the_admin_page_offers_drain_and_undrain():
    inventory = discover_devices(MIXED)
    rows = [
        {"index": 0, "uuid": SLICES[0], "name": "s", "model": "m", "memory_total_bytes": 0, "holders": [],
         "mig": True, "parent_uuid": H200, "drained": True, "utilization_percent": None, "memory_used_bytes": None},
        {"index": 1, "uuid": H100, "name": "g", "model": "m", "memory_total_bytes": 0, "holders": [],
         "mig": False, "parent_uuid": None, "drained": False, "utilization_percent": None, "memory_used_bytes": None},
    ]  # fmt: skip

    def render(admin: bool) -> str:
        return _jinja.get_template("admin.html").render(
            prefix=PREFIX,
            hub_prefix="/hub/",
            caller={"name": "admin"},
            admin=admin,
            inventory=inventory,
            node="n",
            simulated=True,
            gpus=rows,
            users=[],
            groups=[],
            default=Quota(1).to_json(),
            models=[],
            xsrf="x",
        )

    html = render(True)
    assert f'data-gpu="{H200}" data-drained="true">Undrain GPU</button>' in html  # a slice's row: its whole GPU
    assert f'data-gpu="{H100}" data-drained="false">Drain</button>' in html
    assert '<span class="wb-drain-state">draining: no new servers</span>' in html
    assert '<script src="/services/workbench/static/fleet.js"></script>' in html
    script = (files("workbench_hub.service") / "static" / "fleet.js").read_text()
    assert 'if (drained) { api("DELETE", path).then(done).catch(failed); return; }' in script
    assert "if (!ask(drainSentence(button.dataset.label, gpu, body.stop_servers_in_minutes, data.gpus)))" in script
    assert 'id="drain-stop-minutes"' in html
    assert "body.stop_servers_in_minutes = Number(minutes.value)" in script
    assert 'data-label="GPU 0 (m) with all its slices"' in html
    assert 'wb-drain-button"' not in render(False)  # only admins drain
    assert 'id="drain-stop-minutes"' not in render(False)


def test_where_an_engine_places_a_stored_drain_closes_nothing(store):
    """A drain stored while the hub placed GPUs itself, after a move to Slurm or Kubernetes: the engine
    would not read it, so the form and admission must not count the GPU as closed either."""
    from tests.unit.fake_backends import FakeEnginePlacement

    host = make_policy(store)
    DrainBook(store).drain([H100])
    assert {s.device.uuid: s.free_slots for s in host.status()}[H100] == 0
    engine = GPUPolicy(host.settings, store, FakeEnginePlacement(store, host.settings.inventory))
    status = {s.device.uuid: s for s in engine.status()}
    assert (status[H100].drained, status[H100].free_slots) == (False, 1)
