"""MIG slices' utilization from dcgm-exporter (service/dcgm.py): parsing its text, finding a slice by its GPU's
UUID and GPU instance id, the inventory's instance ids (NVML stand-in, simulated, static), the setting."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workbench_devices import GPUDevice, discover_devices
from workbench_hub.service.dcgm import (
    MALFORMED,
    NO_INSTANCE_ID,
    NO_SERIES,
    STALE,
    UNREACHABLE,
    DcgmExporters,
    Sample,
    fetch,
    parse_exporter_text,
)

PARENT = "GPU-5f3c9a1e-77b0-4c2d-9e1f-0a1b2c3d4e5f"
WHOLE = "GPU-0451a3f1-f345-8e4c-6592-e96c0feca949"
NOW = 1_765_000_000.0


def series(value: str, gi: str | None, uuid: str = PARENT, name: str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0") -> str:
    """One line as dcgm-exporter writes it: its default labels, and GPU_I_PROFILE/GPU_I_ID on a MIG instance."""
    mig = f',GPU_I_PROFILE="1g.18gb",GPU_I_ID="{gi}"' if gi is not None else ""
    return (
        f'{name}{{gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:18:00.0",device="nvidia{gpu}",'
        f'modelName="NVIDIA H200"{mig},Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="550.90.07"}} {value}'
    )


EXPORTER_TEXT = "\n".join(
    [
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).",
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
        series("1980", "9", name="DCGM_FI_DEV_SM_CLOCK"),
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        series("12", "9", name="DCGM_FI_DEV_FB_USED"),
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
        series("0.000000", "7"),
        series("0.431250", "8"),
        series("1.000000", "9"),
        series("0.512345", None, uuid=WHOLE, gpu="1"),
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE_EXTRA a metric whose name only begins like ours",
        series("0.99", "11", name="DCGM_FI_PROF_GR_ENGINE_ACTIVE_EXTRA"),
        "",
    ]
)


def test_the_exporters_text_gives_each_instance_a_percent_by_its_gpu_and_instance_id():
    found, unreadable = parse_exporter_text(EXPORTER_TEXT, NOW)
    assert found == {
        (PARENT, 7): Sample(0.0),
        (PARENT, 8): Sample(43.1),
        (PARENT, 9): Sample(100.0),
        (WHOLE, None): Sample(51.2),
    }
    assert unreadable == 0, "other metrics (and names that only begin like ours) are not ours to read"


@pytest.mark.parametrize(
    ("line", "expected", "unreadable"),
    [
        (series("NaN", "7"), {(PARENT, 7): Sample(None, MALFORMED)}, 0),
        (series("+Inf", "7"), {(PARENT, 7): Sample(None, MALFORMED)}, 0),
        (series("-0.5", "7"), {(PARENT, 7): Sample(None, MALFORMED)}, 0),
        (series("43", "7"), {(PARENT, 7): Sample(None, MALFORMED)}, 0),  # a percent where a ratio belongs
        (series("1.0004", "7"), {(PARENT, 7): Sample(100.0)}, 0),  # rounding above 1 is still full
        (series(f"0.2 {int((NOW - 600) * 1000)}", "7"), {(PARENT, 7): Sample(None, STALE)}, 0),
        (series(f"0.2 {int((NOW - 5) * 1000)}", "7"), {(PARENT, 7): Sample(20.0)}, 0),
        (series("abc", "7"), {}, 1),
        (series("0.2", "seven"), {}, 1),
        (series("0.2", "7", uuid=""), {}, 1),
        ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID="' + PARENT + '",GPU_I_ID="7" 0.2', {}, 1),  # unclosed labels
        (series("0.2", ""), {(PARENT, None): Sample(20.0)}, 0),  # GPU_I_ID="": the GPU itself
        # A Prometheus relabelled to lower case (as some dashboards show it) still reads.
        (f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{uuid="{PARENT}",gpu_i_id="12"}} 0.25', {(PARENT, 12): Sample(25.0)}, 0),
    ],
)
def test_a_bad_or_old_value_is_no_reading_and_a_line_that_cannot_be_read_is_counted(line, expected, unreadable):
    assert parse_exporter_text(line + "\n", NOW) == (expected, unreadable)


def test_the_first_series_for_an_instance_wins():
    text = series("0.1", "7") + "\n" + series("0.9", "7") + "\n"
    assert parse_exporter_text(text, NOW)[0] == {(PARENT, 7): Sample(10.0)}


def slice_of(gi: int | None, parent: str = PARENT) -> GPUDevice:
    return GPUDevice(
        f"MIG-{gi}", 0, "H200 MIG 1g.18gb", 18 * 10**9, "H200-141GB", mig=True, profile="1g.18gb",
        parent_uuid=parent, gpu_instance_id=gi,
    )  # fmt: skip


def exporters(answers: dict[str, str | Exception]) -> DcgmExporters:
    def fake_fetch(url: str) -> str:
        answer = answers[url]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return DcgmExporters(fetch=fake_fetch, cache_seconds=0)


@pytest.mark.parametrize(
    ("answers", "device", "expected"),
    [
        ({"a": EXPORTER_TEXT}, slice_of(8), (43.1, "")),
        ({"a": EXPORTER_TEXT}, slice_of(7), (0.0, "")),
        ({"a": EXPORTER_TEXT}, slice_of(8, parent=WHOLE), (None, NO_SERIES)),  # another GPU's instance 8
        ({"a": EXPORTER_TEXT}, slice_of(13), (None, NO_SERIES)),
        ({"a": EXPORTER_TEXT}, slice_of(None), (None, NO_INSTANCE_ID)),
        ({"a": EXPORTER_TEXT}, GPUDevice(WHOLE, 1, "H100", 80 << 30, "H100-80GB"), (51.2, "")),
        ({"a": series("NaN", "8")}, slice_of(8), (None, MALFORMED)),
        ({"a": series("abc", "8")}, slice_of(8), (None, MALFORMED)),
        ({"a": OSError("Connection refused")}, slice_of(8), (None, UNREACHABLE)),
        # Two nodes' exporters: a slice on the one that answers reads; one that is not found may be on the other.
        ({"a": EXPORTER_TEXT, "b": OSError("timed out")}, slice_of(8), (43.1, "")),
        ({"a": EXPORTER_TEXT, "b": OSError("timed out")}, slice_of(13), (None, UNREACHABLE)),
        ({"a": "", "b": EXPORTER_TEXT}, slice_of(9), (100.0, "")),
    ],
)
def test_a_slice_is_found_by_its_gpus_uuid_and_instance_id_else_the_page_says_why(answers, device, expected):
    scrape = exporters(answers).scrape(list(answers))
    assert scrape.reading(device) == expected


def test_one_scrape_serves_everyone_for_a_while_and_a_dead_exporter_is_logged_once(caplog):
    calls = []
    now = [100.0]
    answer: list[str | Exception] = [OSError("Connection refused")]

    def fake_fetch(url):
        calls.append(url)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    book = DcgmExporters(fetch=fake_fetch, clock=lambda: now[0], cache_seconds=2)
    caplog.set_level(logging.INFO, logger="workbench.service")
    book.scrape(["http://n1:9400/metrics"])
    book.scrape(["http://n1:9400/metrics"])
    assert calls == ["http://n1:9400/metrics"], "within the cache time, one scrape for all"
    for _ in range(5):
        now[0] += 3
        book.scrape(["http://n1:9400/metrics"])
    assert len(calls) == 6
    assert sum("unreachable (Connection refused)" in m for m in caplog.messages) == 1, "logged once, not every pass"
    answer[0] = EXPORTER_TEXT
    now[0] += 3
    assert book.scrape(["http://n1:9400/metrics"]).reading(slice_of(8)) == (43.1, "")
    assert sum("answers again" in m for m in caplog.messages) == 1
    answer[0] = OSError("timed out")
    now[0] += 3
    book.scrape(["http://n1:9400/metrics"])
    assert sum("unreachable (timed out)" in m for m in caplog.messages) == 1, "down again: said again"


class Exporter(BaseHTTPRequestHandler):
    body = b""
    status = 200
    delay = 0.0

    def do_GET(self):
        time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("E", (Exporter,), {}))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_fetch_reads_a_real_exporter_and_an_answer_that_is_late_or_an_error_fails(exporter):
    url = f"http://127.0.0.1:{exporter.server_address[1]}/metrics"
    exporter.RequestHandlerClass.body = EXPORTER_TEXT.encode()
    assert fetch(url) == EXPORTER_TEXT
    exporter.RequestHandlerClass.status = 500
    with pytest.raises(OSError, match="500"):
        fetch(url)
    exporter.RequestHandlerClass.status, exporter.RequestHandlerClass.delay = 200, 3.0
    started = time.monotonic()
    scrape = DcgmExporters(fetch=lambda u: fetch(u, timeout=0.5)).scrape([url])
    assert scrape.reading(slice_of(8)) == (None, UNREACHABLE)
    assert "timed out" in scrape.failed[url]
    assert time.monotonic() - started < 2.5, "a late exporter costs the timeout, not its delay"


def test_nvml_gives_each_slice_its_gpu_instance_id_and_none_where_it_cannot(monkeypatch):
    """NVML stand-in: an H100 in MIG mode with three 1g.10gb slices whose GPU instance ids are the driver's
    (7, 8, 9); the third slice's call fails, so it has no id (and so no DCGM reading, never idle)."""
    import sys
    from types import SimpleNamespace

    from tests.unit.fake_nvml import fake_pynvml
    from workbench_devices import nvml_devices

    ids = {0: 7, 1: 8}
    fake = fake_pynvml(1)

    def instance_id(handle):
        if handle[2] not in ids:
            raise fake.NVMLError("Not Supported")
        return ids[handle[2]]

    fake.nvmlDeviceGetMigMode = lambda h: (1, 1)
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda h: 3
    fake.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, i: ("mig", h[1], i)
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3 MIG 1g.10gb" if h[0] == "mig" else b"NVIDIA H100"
    fake.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=10 * 10**9 if h[0] == "mig" else 80 << 30)
    fake.nvmlDeviceGetUUID = lambda h: ("MIG-" if h[0] == "mig" else "GPU-") + "-".join(map(str, h[1:]))
    fake.nvmlDeviceGetGpuInstanceId = instance_id
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    devices = nvml_devices()
    assert [(d.uuid, d.parent_uuid, d.gpu_instance_id) for d in devices] == [
        ("MIG-0-0", "GPU-0", 7),
        ("MIG-0-1", "GPU-0", 8),
        ("MIG-0-2", "GPU-0", None),
    ]
    del fake.nvmlDeviceGetGpuInstanceId  # an old nvidia-ml-py without the call
    assert [d.gpu_instance_id for d in nvml_devices()] == [None, None, None]


def test_simulated_slices_have_a_stable_instance_id_per_place_and_whole_gpus_none():
    devices = discover_devices("1xH200-141GB:mig=2x1g.18gb+1x3g.71gb,1xH100-80GB").devices
    assert [(d.uuid, d.gpu_instance_id) for d in devices] == [
        ("MIG-sim-00-h200-141gb-0-1g.18gb", 1),
        ("MIG-sim-00-h200-141gb-1-1g.18gb", 2),
        ("MIG-sim-00-h200-141gb-2-3g.71gb", 3),
        ("GPU-sim-01-h100-80gb", None),
    ]


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, None), (9, 9), ("12", 12), (0, 0)],
)
def test_a_static_slice_may_name_its_instance_id(given, expected):
    from workbench_spawner.policy.settings import discover_inventory

    entry = {"uuid": f"MIG-static-{given}", "name": "H200 MIG", "profile": "1g.18gb", "parent_uuid": PARENT}
    if given is not None:
        entry["gpu_instance_id"] = given
    [device] = discover_inventory([entry], "").devices
    assert device.gpu_instance_id == expected


@pytest.mark.parametrize("given", ["seven", -1, 1.5, True])
def test_a_static_slices_bad_instance_id_is_a_sentence(given):
    from workbench_spawner.policy.settings import discover_inventory

    entry = {"uuid": "MIG-x", "name": "H200 MIG", "profile": "1g.18gb", "gpu_instance_id": given}
    with pytest.raises(ValueError, match=r"static_gpus entry 0: gpu_instance_id must be a whole number"):
        discover_inventory([entry], "")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("http://gpu-node-1:9400/metrics", ["http://gpu-node-1:9400/metrics"]),
        ("gpu-node-1:9400", ["http://gpu-node-1:9400/metrics"]),
        ("https://dcgm.example.edu/", ["https://dcgm.example.edu/metrics"]),
        (" http://a:9400/metrics , b:9400 ", ["http://a:9400/metrics", "http://b:9400/metrics"]),
        ("ftp://a/metrics", "cannot read 'ftp://a/metrics'"),
        ("http://:9400/metrics", "cannot read"),
        ("a:port", "cannot read 'a:port'"),
    ],
)
def test_the_environment_names_the_exporters(value, expected):
    from traitlets.config import Config

    from workbench_hub.configurer import update_idle
    from workbench_hub.env_values import ConfigError

    c = Config()
    env = {"WORKBENCH_DCGM_EXPORTER_URL": value} if value else {}
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=f"WORKBENCH_DCGM_EXPORTER_URL: {expected}"):
            update_idle(c.GPUSpawnerMixin, env)
        return
    update_idle(c.GPUSpawnerMixin, env)
    assert c.GPUSpawnerMixin.get("dcgm_exporter_urls") == expected


def test_the_setting_is_stored_for_the_service_and_a_bad_url_is_refused():
    from traitlets import TraitError

    from workbench_spawner.policy.config import GPUPolicyConfig
    from workbench_spawner.policy.settings import PolicySettings, resolve_policy_settings

    config = GPUPolicyConfig(simulated_gpus="1xH200-141GB:mig=7x1g.18gb", gpu_db_url="sqlite://")
    assert resolve_policy_settings(config).dcgm_exporter_urls == ()
    config.dcgm_exporter_urls = ["http://gpu-node-1:9400/metrics"]
    settings = resolve_policy_settings(config)
    assert settings.dcgm_exporter_urls == ("http://gpu-node-1:9400/metrics",)
    stored = PolicySettings.from_json(settings.to_json(), "sqlite://")
    assert stored.dcgm_exporter_urls == ("http://gpu-node-1:9400/metrics",)
    assert [d.gpu_instance_id for d in stored.inventory.devices] == list(range(1, 8))
    assert PolicySettings.from_json({}, "sqlite://").dcgm_exporter_urls == (), "a row stored before the setting"
    with pytest.raises(TraitError, match="is not an http"):
        config.dcgm_exporter_urls = ["gpu-node-1:9400"]
