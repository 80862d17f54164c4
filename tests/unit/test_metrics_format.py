"""``render_metrics`` as Prometheus reads it: parsed back with ``prometheus_client``'s own parser,
every family's type and HELP, every series' labels (names and escaped values) and value. Label order
is not part of the format (Prometheus ignores it), so no test reads it.

The fleet is a stand-in with hand-written GPU rows (the shape ``Fleet.gpus()`` returns, a
Slurm annotation on some); leases, the usage ledger and quotas live in a real
``AllocationStore`` on a temporary SQLite file, read through the real ``QuotaBook``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workbench_hub.service.metrics import COUNTERS, HELP, _held_outside, render_metrics
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.reconcile_book import ReconcileBook
from workbench_spawner.ledger.store import AllocationStore, utcnow
from workbench_spawner.rules.quota import Quota

GIB = 1 << 30
ALICE = 'al"ice'  # a quote in a user name
BOB = "bob\\x\ny"  # a backslash and a newline
MODEL_A = 'NVIDIA "H100" 80GB\\HBM3'
MODEL_B = "NVIDIA A100\n40GB"

GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname", "user")


class FakeFleet:
    """What ``render_metrics`` reads of a ``Fleet``: fixed GPU rows over a real store and quota book."""

    def __init__(self, store: AllocationStore, rows: list[dict], simulated: bool, node: str = "head-1"):
        self.store = store
        self.book = QuotaBook(store)
        self.node = node
        self.simulated = simulated
        self.default = Quota(2)
        self._rows = rows

    def gpus(self) -> list[dict]:
        return [dict(row) for row in self._rows]

    def held_by_user(self) -> dict[str, int]:
        """As ``Fleet.held_by_user``: GPUs per user, from the store's leases."""
        held: dict[str, int] = {}
        for lease in self.store.leases():
            held[lease.user] = held.get(lease.user, 0) + len(lease.gpu_uuids)
        return held


def row(
    index, uuid, name, node, holders, total, util=None, used=None, temp=None, power=None, free_slots=0, **extra
) -> dict:
    return {
        "index": index,
        "uuid": uuid,
        "name": name,
        "model": "x",
        "node": node,
        "memory_total_bytes": total,
        "simulated": False,
        "holders": [{"user": u, "server": "", "since": "", "node": node} for u in holders],
        "free_slots": free_slots,
        "utilization_percent": util,
        "memory_used_bytes": used,
        "temperature_c": temp,
        "power_w": power,
        "reading_source": None,
        "idle_seconds": None,
        **extra,
    }


ROWS = [
    # Read live, held by alice.
    row(0, "GPU-a", MODEL_A, "gpu-1", [ALICE], 80 * GIB, util=37.5, used=10 * GIB, temp=55, power=301.25),
    # Not readable (static): no DCGM series; another backend's annotation says nobody else holds it.
    row(1, "GPU-b", MODEL_B, "gpu-1", [BOB], 40 * GIB, other_backend={"held_outside_workbench": False}),
    # Free, on the fleet's own node (empty node), held by a Slurm job outside the workbench; no temperature.
    row(
        2,
        "GPU-c",
        MODEL_A,
        "",
        [],
        80 * GIB,
        util=0.0,
        used=0,
        power=70.0,
        free_slots=2,
        slurm={"node_state": "mixed", "allocated": True, "held_outside_workbench": True},
    ),
    # Shared by two users, memory full; Slurm says it is not held outside; an unrelated dict entry.
    row(
        0,
        "GPU-d",
        MODEL_B,
        "gpu-2",
        ["zed", "amy"],
        40 * GIB,
        util=100,
        used=40 * GIB,
        temp=80,
        power=250,
        slurm={"node_state": "allocated", "allocated": True, "held_outside_workbench": False},
        extra={"x": 1},
    ),
]


@pytest.fixture
def store(tmp_path):
    s = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    now = utcnow()
    assert s.adopt(ALICE, "", ["GPU-a"], ref="r1", since=now - timedelta(hours=2.5), node="gpu-1")
    assert s.adopt(BOB, "", ["GPU-b"], ref="r2", since=now - timedelta(hours=1.25), node="gpu-1")
    assert s.allocate("zed", "", 1, ["GPU-d"], slots_per_gpu=2, node="gpu-2")
    assert s.allocate("amy", "", 1, ["GPU-d"], slots_per_gpu=2, node="gpu-2")
    # carol ran for 5 hours and stopped: GPU-hours from the usage ledger, nothing held.
    assert s.adopt("carol", "", ["GPU-c"], ref="r3", since=now - timedelta(hours=5))
    s.release("carol", "")
    book = QuotaBook(s)
    book.set("group", "ml", Quota(3))
    book.set("user", "dave", Quota(4))  # an own quota, no lease
    yield s
    s.dispose()


USERS = [{"name": ALICE, "groups": []}, {"name": BOB, "groups": ["ml"]}, {"name": "erin", "groups": ["ml", "x"]}]


def parse(text: str) -> dict[str, tuple[str, str, list[tuple[dict, float]]]]:
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, family.name
        families[family.name] = (family.type, family.documentation, [(s.labels, s.value) for s in family.samples])
    return families


def gpu(index, uuid, model, host, user, simulated):
    labels = {"gpu": str(index), "UUID": uuid, "modelName": model, "Hostname": host, "user": user}
    return {**labels, "simulated": "true"} if simulated else labels


def expected_gpu_series(simulated: bool) -> dict[str, list[tuple[dict, float]]]:
    a = gpu(0, "GPU-a", MODEL_A, "gpu-1", ALICE, simulated)
    b = gpu(1, "GPU-b", MODEL_B, "gpu-1", BOB, simulated)
    c = gpu(2, "GPU-c", MODEL_A, "head-1", "", simulated)
    d = gpu(0, "GPU-d", MODEL_B, "gpu-2", "amy,zed", simulated)
    return {
        "DCGM_FI_DEV_GPU_UTIL": [(a, 37.5), (c, 0.0), (d, 100.0)],
        "DCGM_FI_DEV_FB_USED": [(a, 10240.0), (c, 0.0), (d, 40960.0)],
        "DCGM_FI_DEV_FB_FREE": [(a, 71680.0), (c, 81920.0), (d, 0.0)],
        "DCGM_FI_DEV_GPU_TEMP": [(a, 55.0), (d, 80.0)],
        "DCGM_FI_DEV_POWER_USAGE": [(a, 301.25), (c, 70.0), (d, 250.0)],
        "workbench_gpu_allocated": [(a, 1.0), (b, 1.0), (c, 0.0), (d, 2.0)],
        "workbench_gpu_memory_total_bytes": [
            (a, 85899345920.0),
            (b, 42949672960.0),
            (c, 85899345920.0),
            (d, 42949672960.0),
        ],
        "workbench_gpu_held_outside": [(b, 0.0), (c, 1.0), (d, 0.0)],
        "workbench_gpus": [({"Hostname": "gpu-1"}, 2.0), ({"Hostname": "gpu-2"}, 1.0), ({"Hostname": "head-1"}, 1.0)],
        "workbench_gpus_free": [
            ({"Hostname": "gpu-1"}, 0.0),
            ({"Hostname": "gpu-2"}, 0.0),
            ({"Hostname": "head-1"}, 1.0),
        ],
    }


# GPU-hours: leases held for 2.5 h (alice) and 1.25 h (bob), just taken (amy, zed), 5 h finished (carol).
HOURS = {ALICE: 2.5, "amy": 0.0, BOB: 1.25, "carol": 5.0, "zed": 0.0}
HELD = {ALICE: 1.0, "amy": 1.0, BOB: 1.0, "carol": 0.0, "zed": 1.0}


def user_series(parsed, name) -> dict[str, float]:
    samples = parsed[name][2]
    assert all(set(labels) == {"user"} for labels, _ in samples), samples
    users = [labels["user"] for labels, _ in samples]
    assert users == sorted(users), "one series per user, sorted by name"
    return {labels["user"]: value for labels, value in samples}


@pytest.mark.parametrize("simulated", [False, True])
def test_every_family_type_help_label_set_and_value(store, simulated):
    text = render_metrics(FakeFleet(store, ROWS, simulated), USERS)
    parsed = parse(text)
    assert list(parsed) == [*HELP, *COUNTERS], "every family, in the documented order: the gauges, then counters"
    for name, (kind, documentation, _) in parsed.items():
        if name in COUNTERS:
            assert (kind, documentation) == ("counter", COUNTERS[name]), name
            continue
        assert kind == "gauge", name
        assert documentation == HELP[name], name
        assert f"# HELP {name} {HELP[name]}\n# TYPE {name} gauge\n" in text
    assert parsed["workbench_gpu_held_outside"][1] == (
        "1 if the engine allocates this GPU to a job outside the workbench (Slurm; Kubernetes by count per node)."
    )
    assert parsed["DCGM_FI_DEV_FB_USED"][1] == "Framebuffer memory used (in MiB)."
    for name, samples in expected_gpu_series(simulated).items():
        assert parsed[name][2] == samples, name
    assert user_series(parsed, "workbench_user_gpus_held") == HELD
    hours = user_series(parsed, "workbench_user_gpu_hours_week")
    assert hours == {user: pytest.approx(value, abs=1e-3) for user, value in HOURS.items()}
    # The hub's users: own default (2), group ml's quota (3) for bob and erin.
    assert user_series(parsed, "workbench_user_quota_max_gpus") == {ALICE: 2.0, BOB: 3.0, "erin": 3.0}


def test_without_the_hubs_users_quotas_cover_holders_usage_and_own_quotas(store):
    parsed = parse(render_metrics(FakeFleet(store, ROWS, simulated=False)))
    # No groups known: bob falls back to the default; dave has an own quota and no lease.
    assert user_series(parsed, "workbench_user_quota_max_gpus") == {
        ALICE: 2.0,
        "amy": 2.0,
        BOB: 2.0,
        "carol": 2.0,
        "dave": 4.0,
        "zed": 2.0,
    }


def test_labels_are_dcgm_exporters_and_quotes_backslashes_newlines_round_trip(store):
    parsed = parse(render_metrics(FakeFleet(store, ROWS, simulated=True), USERS))
    for name, (_, _, samples) in parsed.items():
        if name in ("workbench_gpus", "workbench_gpus_free"):
            expected = {"Hostname"}
        elif name == "workbench_reconcile_fixes":
            expected = {"kind"}
        elif name.startswith("workbench_user_"):
            expected = {"user"}
        else:
            expected = {*GPU_LABELS, "simulated"}
        assert samples, name
        assert all(set(labels) == expected for labels, _ in samples), name
    assert set(parsed) == set(HELP) | set(COUNTERS)
    # The text format's escapes, written by prometheus_client, read back to the original strings.
    util = parsed["DCGM_FI_DEV_GPU_UTIL"][2]
    assert util[0] == (
        {"gpu": "0", "UUID": "GPU-a", "modelName": MODEL_A, "Hostname": "gpu-1", "user": ALICE, "simulated": "true"},
        37.5,
    )
    held = dict((labels["user"], value) for labels, value in parsed["workbench_user_gpus_held"][2])
    assert held[ALICE] == 1.0
    assert held[BOB] == 1.0
    models = {labels["modelName"] for labels, _ in parsed["workbench_gpu_allocated"][2]}
    users = {labels["user"] for labels, _ in parsed["workbench_gpu_allocated"][2]}
    assert models == {MODEL_A, MODEL_B}
    assert users == {ALICE, BOB, "", "amy,zed"}


def test_a_value_that_is_hard_to_escape_still_round_trips(store):
    nasty = 'a} 1\n# HELP x "y" \\ {z="w"}\x0cp\u2028q\u00e9'  # other line breaks go unescaped
    rows = [row(0, "GPU-a", nasty, nasty, [nasty], 8 * GIB, util=12.0)]
    parsed = parse(render_metrics(FakeFleet(store, rows, simulated=False), []))
    labels = {"gpu": "0", "UUID": "GPU-a", "modelName": nasty, "Hostname": nasty, "user": nasty}
    assert parsed["DCGM_FI_DEV_GPU_UTIL"][2] == [(labels, 12.0)]
    assert parsed["workbench_gpus"][2] == [({"Hostname": nasty}, 1.0)]


def test_absent_readings_and_annotations_emit_no_sample_and_no_empty_family(store):
    rows = [row(0, "GPU-s", "NVIDIA L4", "", [], 24 * GIB, free_slots=1)]  # static: nothing read, no backend notes
    text = render_metrics(FakeFleet(store, rows, simulated=False), [{"name": "erin", "groups": []}])
    parsed = parse(text)
    assert "DCGM_" not in text, "no reading, no DCGM family (not even HELP/TYPE)"
    assert "workbench_gpu_held_outside" not in text
    assert list(parsed) == [
        "workbench_gpu_allocated",
        "workbench_gpu_memory_total_bytes",
        "workbench_gpus",
        "workbench_gpus_free",
        "workbench_user_gpus_held",
        "workbench_user_gpu_hours_week",
        "workbench_user_quota_max_gpus",
        "workbench_reconcile_fixes",  # always: every kind at 0 before the first fix
    ]
    labels = {"gpu": "0", "UUID": "GPU-s", "modelName": "NVIDIA L4", "Hostname": "head-1", "user": ""}
    assert parsed["workbench_gpu_allocated"][2] == [(labels, 0.0)]
    assert parsed["workbench_gpu_memory_total_bytes"][2] == [(labels, 25769803776.0)]
    assert parsed["workbench_gpus_free"][2] == [({"Hostname": "head-1"}, 1.0)]
    assert parsed["workbench_user_quota_max_gpus"][2] == [({"user": "erin"}, 2.0)]


def test_one_reading_missing_drops_only_its_series(store):
    rows = [row(3, "GPU-t", "NVIDIA L4", "n", [], 24 * GIB, util=5.0, used=None, temp=None, power=72.5)]
    parsed = parse(render_metrics(FakeFleet(store, rows, simulated=False), []))
    assert [n for n in parsed if n.startswith("DCGM_")] == ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"]
    assert [v for _, v in parsed["DCGM_FI_DEV_POWER_USAGE"][2]] == [72.5]
    assert "workbench_user_quota_max_gpus" not in parsed  # no users given: no quota series


def test_an_empty_fleet_still_counts_its_node(tmp_path):
    s = AllocationStore(f"sqlite:///{tmp_path / 'empty.sqlite'}")
    try:
        text = render_metrics(FakeFleet(s, [], simulated=True, node="lonely"), None)
    finally:
        s.dispose()
    assert parse(text) == {
        "workbench_gpus": ("gauge", HELP["workbench_gpus"], [({"Hostname": "lonely"}, 0.0)]),
        "workbench_gpus_free": ("gauge", HELP["workbench_gpus_free"], [({"Hostname": "lonely"}, 0.0)]),
        "workbench_reconcile_fixes": (
            "counter",
            COUNTERS["workbench_reconcile_fixes"],
            [({"kind": kind}, 0.0) for kind in ("lease_closed", "server_adopted", "server_stopped")],
        ),
    }


def test_the_reconcilers_fixes_are_a_counter_by_kind_read_from_the_database(store):
    """The hub's reconciler counts in the GPU database; the service (another process) serves the counts."""
    book = ReconcileBook(store)
    for kind in ("lease_closed", "lease_closed", "server_stopped", "a_future_kind"):
        book.count(kind)
    parsed = parse(render_metrics(FakeFleet(store, ROWS, simulated=False), USERS))
    kind, documentation, samples = parsed["workbench_reconcile_fixes"]
    assert kind == "counter"
    assert documentation == COUNTERS["workbench_reconcile_fixes"]
    assert {labels["kind"]: value for labels, value in samples} == {
        "a_future_kind": 1.0,
        "lease_closed": 2.0,
        "server_adopted": 0.0,
        "server_stopped": 1.0,
    }
    again = parse(render_metrics(FakeFleet(store, [], simulated=False), None))["workbench_reconcile_fixes"][2]
    assert ({"kind": "lease_closed"}, 2.0) in again


def test_held_outside_is_read_from_any_backends_annotation():
    assert _held_outside({"slurm": {"node_state": "idle", "allocated": True, "held_outside_workbench": True}}) is True
    assert _held_outside({"k8s": {"held_outside_workbench": 0}}) is False
    assert _held_outside({"slurm": {"node_state": "unknown", "allocated": False}}) is None
    assert (
        _held_outside({"holders": [], "name": "held_outside_workbench", "x": {"held_outside_workbench": None}}) is None
    )
    assert _held_outside({"a": {"other": 1}, "b": {"held_outside_workbench": 1}}) is True
    assert _held_outside({}) is None
