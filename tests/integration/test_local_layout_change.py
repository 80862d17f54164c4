"""A GPU's MIG layout changes while the real hub runs (local backend, a simulated layout in a file): the admin
drains the GPU, the layout is cut again, the hub and the workbench service adopt it without a restart."""

from __future__ import annotations

import time

import pytest

from tests.conftest import process_env, wait_until

pytestmark = pytest.mark.integration

SEVEN = "1xH200-141GB:mig=7x1g.18gb"
TWO = "1xH200-141GB:mig=2x3g.71gb"


def slices(hub) -> list[tuple[str, str]]:
    gpus = hub.service("GET", "api/gpus").json()
    rows = gpus["gpus"] if isinstance(gpus, dict) else gpus
    return [(r["uuid"], r["profile"]) for r in rows]


def test_a_new_layout_is_used_without_a_restart(running_hub, tmp_path):
    layout = tmp_path / "layout.txt"
    layout.write_text(SEVEN)
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": f"@{layout}", "WORKBENCH_INVENTORY_REFRESH_SECONDS": "1"},
    )
    hub.create_users("ann", "ben")
    assert len(slices(hub)) == 7
    assert hub.spawn("ann", gpus=1, gpu_profile="1g.18gb").status_code in (201, 202)
    hub.wait_ready("ann", 180)
    assert hub.leases()["ann"] == ["MIG-sim-00-h200-141gb-0-1g.18gb"]

    # The admin's procedure: drain the GPU, let its servers end, cut it again, undrain.
    assert hub.service("PUT", "api/drains/GPU-sim-00-h200-141gb", json={"reason": "7x1g -> 2x3g"}).status_code == 200
    assert hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    hub.wait_stopped("ann")
    layout.write_text(TWO)
    time.sleep(1.5)  # WORKBENCH_INVENTORY_REFRESH_SECONDS since the last read
    # The hub reads it again when the policy is next needed (here: ben's spawn), before admission: the old
    # profile is gone. The workbench service follows from the stored settings.
    refused = hub.spawn("ben", gpus=1, gpu_profile="1g.18gb")
    assert refused.status_code == 400, refused.text
    assert "1g.18gb" in refused.json()["message"], refused.text
    assert "The GPU inventory changed" in hub.log()
    wait_until(
        lambda: slices(hub) == [(f"MIG-sim-00-h200-141gb-{i}-3g.71gb", "3g.71gb") for i in range(2)],
        30,
        "api/gpus to list the new layout",
        log=hub.log,
    )
    assert hub.service("DELETE", "api/drains/GPU-sim-00-h200-141gb").status_code == 204
    assert hub.spawn("ben", gpus=1, gpu_profile="3g.71gb").status_code in (201, 202)
    hub.wait_ready("ben", 180)
    env = process_env(int(hub.server("ben")["state"]["pid"]))
    assert env["WORKBENCH_GPUS"] == env["CUDA_VISIBLE_DEVICES"] == "MIG-sim-00-h200-141gb-0-3g.71gb"
    assert env["WORKBENCH_SIMULATED_GPUS"] == TWO, "the server is told the layout in force, not the hub's file"


# -- a layout change while servers hold slices: nothing is handed out twice, the held GPU waits ----------------

TWO_GPUS_SEVEN = "2xH200-141GB:mig=7x1g.18gb"
TWO_GPUS_TWO = "2xH200-141GB:mig=2x3g.71gb"
ONE_OF_TWO = "1xH200-141GB:mig=7x1g.18gb,1xH200-141GB"  # GPU 0 cut in seven, GPU 1 whole
TWO_OF_ONE = "1xH200-141GB,1xH200-141GB:mig=7x1g.18gb"  # the other way round
WAIT_3 = "layout change waiting: 3 servers still on slices the new layout removes"


def gpus(hub) -> dict:
    return hub.service("GET", "api/gpus").json()


def gpu_of(uuid: str) -> str:
    """The simulated GPU a device is or belongs to: ``00`` for GPU-sim-00-... and MIG-sim-00-..."""
    return uuid.split("-")[2]


def compute_slices(uuid: str) -> int:
    """A device's compute slices: 7 for a whole H200, 3 for a 3g slice."""
    return int(uuid.rsplit("-", 1)[1].split("g.")[0]) if uuid.startswith("MIG-") else 7


def live_devices(hub, users) -> dict[str, list[str]]:
    """The devices each live server of ``users`` was started on, from its own process environment."""
    found = {}
    for user in users:
        server = hub.server(user)
        if server and server.get("ready") and (server.get("state") or {}).get("pid"):
            env = process_env(int(server["state"]["pid"]))
            found[user] = [u for u in env.get("WORKBENCH_GPUS", "").split(",") if u]
    return found


def assert_nothing_handed_out_twice(hub, users) -> None:
    """Never two live servers (or leases) on one device, never a whole GPU over live slices or slices over a
    live whole GPU, never more compute slices of a GPU in use than it has, no lease on a device not listed."""
    listed = {row["uuid"] for row in gpus(hub)["gpus"]}
    for what, holdings in (("leases", hub.leases()), ("live servers", live_devices(hub, users))):
        devices = [uuid for held in holdings.values() for uuid in held]
        assert len(devices) == len(set(devices)), f"a device held twice by {what}: {holdings}"
        by_gpu: dict[str, list[str]] = {}
        for uuid in devices:
            by_gpu.setdefault(gpu_of(uuid), []).append(uuid)
        for gpu, held in by_gpu.items():
            whole = [u for u in held if u.startswith("GPU-")]
            assert not whole or len(held) == 1, f"GPU {gpu} whole and in slices at once ({what}): {holdings}"
            assert sum(compute_slices(u) for u in held) <= 7, f"GPU {gpu} over-committed ({what}): {holdings}"
        if what == "leases":
            assert set(devices) <= listed, f"a lease on a device the hub no longer lists: {holdings}"


def test_a_layout_change_waits_for_three_servers_on_its_slices_and_other_gpus_adopt_at_once(running_hub, tmp_path):
    layout = tmp_path / "layout.txt"
    layout.write_text(TWO_GPUS_SEVEN)
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": f"@{layout}", "WORKBENCH_INVENTORY_REFRESH_SECONDS": "1"})
    users = ("ann", "ben", "cat", "dan")
    hub.create_users(*users)
    for user in ("ann", "ben", "cat"):
        assert hub.spawn(user, gpus=1, gpu_profile="1g.18gb").status_code in (201, 202)
    for user in ("ann", "ben", "cat"):
        hub.wait_ready(user, 180)
    held = sorted(uuid for user in ("ann", "ben", "cat") for uuid in hub.leases()[user])
    assert held == [f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(3)]

    # Both GPUs are cut again, with nobody spawning: the hub's timer reads it. GPU 1 (free) adopts at once;
    # GPU 0 keeps its seven slices for the three servers on them, closed to new servers, and says so.
    layout.write_text(TWO_GPUS_TWO)
    wait_until(
        lambda: [r["profile"] for r in gpus(hub)["gpus"]] == ["1g.18gb"] * 7 + ["3g.71gb"] * 2,
        30,
        "GPU 1 to adopt its new layout while GPU 0 keeps its old one",
        log=hub.log,
    )
    answer = gpus(hub)
    assert [(w["gpu_uuid"], w["message"]) for w in answer["layout_waiting"]] == [("GPU-sim-00-h200-141gb", WAIT_3)]
    rows = answer["gpus"]
    assert all(r["layout_waiting"] == WAIT_3 and r["free_slots"] == 0 for r in rows[:7]), rows[:7]
    assert all(r["layout_waiting"] is None and r["free_slots"] == 1 for r in rows[7:]), rows[7:]
    page = hub.service("GET", "")
    assert page.status_code == 200, page.text[-2000:]
    assert WAIT_3 in page.text, page.text[-2000:]
    assert sorted(hub.leases()) == ["ann", "ben", "cat"], "nobody's lease was closed"
    assert "MIG layout changed" not in hub.log()
    assert_nothing_handed_out_twice(hub, users)

    # dan gets one of GPU 1's new slices, never one over GPU 0's live ones.
    assert hub.spawn("dan", gpus=1, gpu_profile="3g.71gb").status_code in (201, 202)
    hub.wait_ready("dan", 180)
    assert hub.leases()["dan"] == ["MIG-sim-01-h200-141gb-0-3g.71gb"]
    assert_nothing_handed_out_twice(hub, users)

    # The three stop: GPU 0 adopts its new layout.
    for user in ("ann", "ben"):
        assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
        hub.wait_stopped(user)
    wait_until(
        lambda: (
            gpus(hub)["layout_waiting"][0]["message"]
            == "layout change waiting: 1 server still on slices the new layout removes"
        ),
        30,
        "the wait to count the one server left",
        log=hub.log,
    )
    assert hub.api("DELETE", "/users/cat/server").status_code in (202, 204)
    hub.wait_stopped("cat")
    wait_until(
        lambda: (
            [r["uuid"] for r in gpus(hub)["gpus"]]
            == [f"MIG-sim-0{g}-h200-141gb-{i}-3g.71gb" for g in (0, 1) for i in (0, 1)]
        ),
        30,
        "GPU 0 to adopt its new layout once its servers stopped",
        log=hub.log,
    )
    answer = gpus(hub)
    assert answer["layout_waiting"] == []
    assert all(r["layout_waiting"] is None for r in answer["gpus"])
    assert "layout change waiting" not in hub.service("GET", "").text
    assert hub.leases() == {"dan": ["MIG-sim-01-h200-141gb-0-3g.71gb"]}
    assert_nothing_handed_out_twice(hub, users)


def test_changing_a_layout_back_and_forth_under_running_servers_never_hands_a_device_out_twice(running_hub, tmp_path):
    layout = tmp_path / "layout.txt"
    layout.write_text(ONE_OF_TWO)
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": f"@{layout}", "WORKBENCH_INVENTORY_REFRESH_SECONDS": "1"})
    users = ("ann", "ben", "cat")
    hub.create_users(*users)
    assert hub.spawn("ann", gpus=1, gpu_profile="1g.18gb").status_code in (201, 202)
    assert hub.spawn("ben", gpus=1, gpu_model="H200-141GB").status_code in (201, 202)
    hub.wait_ready("ann", 180)
    hub.wait_ready("ben", 180)
    assert hub.leases() == {"ann": ["MIG-sim-00-h200-141gb-0-1g.18gb"], "ben": ["GPU-sim-01-h200-141gb"]}

    def layout_in_force() -> list[tuple[str, str | None]]:
        return [(r["uuid"], r["layout_waiting"]) for r in gpus(hub)["gpus"]]

    for turn in range(2):
        # GPU 0 would become whole under ann's slice, GPU 1 cut under ben's whole GPU: both wait.
        layout.write_text(TWO_OF_ONE)
        wait_until(lambda: len(gpus(hub)["layout_waiting"]) == 2, 30, "both GPUs to wait", log=hub.log)
        assert [w["removes"] for w in gpus(hub)["layout_waiting"]] == ["slices", "whole"]
        assert [u for u, _ in layout_in_force()] == [
            *(f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(7)),
            "GPU-sim-01-h200-141gb",
        ]
        if turn == 0:
            # cat asks for a whole GPU: none may be given (GPU 0 is slices with ann on one, GPU 1 is ben's).
            assert hub.spawn("cat", gpus=1, gpu_model="H200-141GB").status_code in (201, 202)
        time.sleep(2.5)  # two refreshes
        assert_nothing_handed_out_twice(hub, users)
        assert "cat" not in hub.leases()
        # ... and back: nothing waits any more, nothing changed.
        layout.write_text(ONE_OF_TWO)
        wait_until(lambda: gpus(hub)["layout_waiting"] == [], 30, "the wait to end", log=hub.log)
        assert all(waiting is None for _, waiting in layout_in_force())
        assert_nothing_handed_out_twice(hub, users)
        assert hub.leases() == {"ann": ["MIG-sim-00-h200-141gb-0-1g.18gb"], "ben": ["GPU-sim-01-h200-141gb"]}

    # Cut it the other way once more and let ann stop: GPU 0 becomes whole, and cat (waiting in line) gets it;
    # GPU 1 keeps ben's whole GPU until he stops.
    layout.write_text(TWO_OF_ONE)
    wait_until(lambda: len(gpus(hub)["layout_waiting"]) == 2, 30, "both GPUs to wait", log=hub.log)
    assert hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    hub.wait_stopped("ann")
    hub.wait_ready("cat", 180)
    assert hub.leases() == {"ben": ["GPU-sim-01-h200-141gb"], "cat": ["GPU-sim-00-h200-141gb"]}
    assert [w["gpu_uuid"] for w in gpus(hub)["layout_waiting"]] == ["GPU-sim-01-h200-141gb"]
    assert_nothing_handed_out_twice(hub, users)
    assert hub.api("DELETE", "/users/ben/server").status_code in (202, 204)
    hub.wait_stopped("ben")
    wait_until(
        lambda: (
            [u for u, _ in layout_in_force()]
            == ["GPU-sim-00-h200-141gb", *(f"MIG-sim-01-h200-141gb-{i}-1g.18gb" for i in range(7))]
        ),
        30,
        "GPU 1 to be cut once ben stopped",
        log=hub.log,
    )
    assert gpus(hub)["layout_waiting"] == []
    assert_nothing_handed_out_twice(hub, users)
