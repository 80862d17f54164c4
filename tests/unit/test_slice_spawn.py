"""MIG slices through the spawner as the hub drives it: the form's choice of kind, and a slice pinned."""

from __future__ import annotations

from importlib.resources import files
from types import SimpleNamespace

from tests.unit.fake_backends import FakeEnginePlacement, FakeEngineSpawner
from tests.unit.test_quota_spawn import make_spawner as make_spawner  # the fixture, for pytest to find
from workbench_spawner.policy.gpu_policy import _policies
from workbench_spawner.rules.quota import Quota

MIXED = "1xH200-141GB:mig=7x1g.18gb,1xH100-80GB"


async def test_the_form_offers_whole_gpus_and_each_profile_with_what_is_free(make_spawner):
    spawner = make_spawner(simulated_gpus=MIXED)
    html = await spawner._render_options_form()
    assert 'name="gpu_profile"' in html
    assert '<option value="">Whole GPUs: 1 of 1 free</option>' in html
    assert '<span id="workbench-free">1 of 1 GPU and 7 of 7 MIG slices free now</span>' in html
    assert '<option value="1g.18gb">1 \u00d7 1g.18gb slice of an H200-141GB, 18 GB: 7 of 7 free</option>' in html
    assert "A server gets one slice at most" in html
    assert "for more room pick whole GPUs." in html
    assert "larger slice" not in html, "one profile only: there is no larger slice to pick"


async def test_a_student_is_offered_only_the_slices_the_quota_allows(make_spawner):
    spawner = make_spawner(simulated_gpus=MIXED, groups=("students",))
    spawner.gpu_quota_book.set("group", "students", Quota(3, whole_gpus=False, allowed_profiles=("1g.18gb",)))
    html = await spawner._render_options_form()
    assert "Whole GPUs" not in html
    assert '<option value="1g.18gb">' in html
    assert "(a CUDA program sees only one MIG slice)." in html, "nothing larger or whole to suggest to this student"
    assert 'max="1"' in html, "one slice a server, though the quota allows 3 at once"


async def test_a_hub_without_slices_keeps_its_form(make_spawner):
    html = await make_spawner()._render_options_form()
    assert 'name="gpu_profile"' not in html


async def test_a_slice_is_pinned_and_a_second_student_gets_another(make_spawner):
    first, second = make_spawner(simulated_gpus=MIXED), make_spawner("bob", simulated_gpus=MIXED)
    for spawner in (first, second):
        await spawner._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
        await spawner._acquire(spawner.gpu_request)
    leases = {lease.user: lease.gpu_uuids for lease in first.gpu_policy.store.leases()}
    assert all(len(g) == 1 and g[0].startswith("MIG-sim-00-h200-141gb-") for g in leases.values()), leases
    assert leases["alice"] != leases["bob"]
    # A whole GPU is still a whole GPU: never one of the slices.
    third = make_spawner("carol", simulated_gpus=MIXED)
    await third._apply_gpu_options({"gpus": 1})
    assert (await third._acquire(third.gpu_request)).gpu_uuids == ("GPU-sim-01-h100-80gb",)


def test_a_lease_on_slices_that_no_longer_exist_is_closed_with_the_reason(tmp_path):
    """The layout changed while the hub was down (7x1g.18gb -> 3x2g.35gb): the old slices' lease is
    released at reconcile and the ledger says why; a lease on a slice that still exists is kept."""
    from workbench_devices import DeviceInventory, parse_simulated_spec
    from workbench_spawner.ledger.store import AllocationStore
    from workbench_spawner.policy.gpu_policy import GPUPolicy
    from workbench_spawner.policy.settings import PolicySettings

    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    store = AllocationStore(url)
    assert store.adopt("old", "", ["MIG-sim-00-h200-141gb-4-1g.18gb"], "pid:1")
    assert store.adopt("kept", "", ["MIG-sim-01-h200-141gb-0-2g.35gb"], "pid:2")
    devices = parse_simulated_spec("2xH200-141GB:mig=3x2g.35gb")
    policy = GPUPolicy(PolicySettings(url, DeviceInventory("simulated", devices, "test"), node="n"), store)
    released = policy.reconcile(lambda lease: True)
    assert [lease.user for lease in released] == ["old"]
    assert [lease.user for lease in store.leases()] == ["kept"]
    (row,) = store.usage(user="old")
    assert row.reason == "MIG layout changed"


def test_a_lease_is_kept_when_nvml_could_not_read_every_gpu(tmp_path):
    """At a restart NVML shows a MIG GPU but not its slices (a passing error): a lease on slices that are
    not in this read may still be running there, so reconcile keeps it rather than calling it a layout change."""
    from workbench_devices import DeviceInventory, parse_simulated_spec
    from workbench_spawner.ledger.store import AllocationStore
    from workbench_spawner.policy.gpu_policy import GPUPolicy
    from workbench_spawner.policy.settings import PolicySettings

    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    store = AllocationStore(url)
    assert store.adopt("ann", "", ["MIG-sim-00-h200-141gb-4-1g.18gb"], "pid:1")
    read = DeviceInventory("nvml", parse_simulated_spec("1xH100-80GB"), "test", unread=("GPU 1 (H200): slices",))
    policy = GPUPolicy(PolicySettings(url, read, node="n"), store)
    assert policy.reconcile(lambda lease: True) == []
    assert [lease.user for lease in store.leases()] == ["ann"]


def test_the_fleet_page_says_which_servers_have_no_idle_rule_and_why():
    """A held MIG slice has no utilization reading (NVML has none per slice): never counted as idle,
    and the fleet page says so, on the first render and in the JavaScript that refreshes it."""
    from workbench_devices import discover_devices
    from workbench_hub.service.handlers import _jinja
    from workbench_spawner.rules.quota import Quota

    def row(uuid: str, mig: bool) -> dict:
        return {
            "index": 0,
            "uuid": uuid,
            "name": "H200",
            "model": "H200-141GB",
            "mig": mig,
            "memory_total_bytes": 0,
            "holders": [{"user": "ann", "server": "", "since": "2026-12-05T10:00:00"}],
            "utilization_percent": None,
            "memory_used_bytes": None,
            "idle_seconds": None,
            "drained": False,
        }

    html = _jinja.get_template("admin.html").render(
        prefix="/services/workbench/",
        hub_prefix="/hub/",
        caller={"name": "admin"},
        admin=True,
        inventory=discover_devices("1xH200-141GB:mig=7x1g.18gb,1xH100-80GB"),
        node="n",
        simulated=True,
        gpus=[row("MIG-sim-00-h200-141gb-0-1g.18gb", True), row("GPU-sim-01-h100-80gb", False)],
        users=[],
        groups=[],
        default=Quota(1).to_json(),
        models=[],
        xsrf="x",
    )
    assert html.count("no reading (MIG slice): no idle rule</span>") == 1
    assert html.count("no reading: no idle rule</span>") == 1
    script = (files("workbench_hub.service") / "static" / "fleet.js").read_text()  # the page's live refresh
    assert '(g.mig ? "no reading (MIG slice" + (g.no_reading_reason ? ": " + g.no_reading_reason : "") +' in script


# -- an engine: reservations hold whole GPUs, so a request for slices never waits for them ---------------------


class SliceEngine(FakeEnginePlacement):
    """The reference engine, pinning slices (as Slurm's GRES types and Kubernetes' MIG resources do)."""

    pins_slices = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked: list[tuple[str, int, str | None]] = []

    async def admit_to_queue(self, key, count, model, groups, deadline, describe=lambda text: None) -> None:
        self.asked.append((key, count, model))
        await super().admit_to_queue(key, count, model, groups, deadline, describe)


class SliceEngineSpawner(FakeEngineSpawner):
    def engine_placement(self, settings, store):
        return SliceEngine(store, settings.inventory)


async def test_an_engine_sends_a_slice_request_past_the_whole_gpu_reservation_check(tmp_path):
    _policies.clear()

    def make(user: str) -> SliceEngineSpawner:
        return SliceEngineSpawner(
            user=SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user, groups=[]),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
            simulated_gpus="1xH200-141GB:mig=2x1g.18gb,1xH100-80GB",
        )

    alice, bob = make("alice"), make("bob")
    await alice._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    await alice.start()
    placement = alice.gpu_policy.placement
    assert placement.asked == [], "a slice request went through the whole-GPU reservation check"
    await bob._apply_gpu_options({"gpus": 1})
    await bob.start()
    assert placement.asked == [("bob/", 1, None)], "a whole-GPU request still is checked"
    _policies.clear()
