"""``GPUMonitor`` in a real IPython kernel: it renders, and keeps updating while a cell runs."""

from __future__ import annotations

import contextlib
import os
import queue
import textwrap
import time
from collections.abc import Iterator

import pytest

from tests.monitor.monitor_support import DEVICES_DIR, EXTENSION_DIR

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")


@contextlib.contextmanager
def started_kernel(env: dict) -> Iterator[jupyter_client.BlockingKernelClient]:
    """A fresh python3 kernel: the extension from this checkout, none of the test run's own GPU pins."""
    kernel_env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKBENCH_", "CUDA_VISIBLE"))}
    kernel_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(EXTENSION_DIR), str(DEVICES_DIR), os.environ.get("PYTHONPATH", "")])
    )
    kernel_env.update(env)
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env=kernel_env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_in_kernel(env: dict, code: str, busy_seconds: float = 3.0):
    """Execute `code` in a fresh kernel, collect widget comm messages until the cell finishes."""
    with started_kernel(env) as kc:
        msg_id = kc.execute(code)
        opened, updates, outputs, error = None, [], [], None
        deadline = time.time() + 60 + busy_seconds
        while time.time() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=2)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content["data"].get("state", {}).get("_model_name") == "HTMLModel":
                opened = content
            elif kind == "comm_msg" and content["data"].get("method") == "update":
                if "value" in content["data"].get("state", {}):
                    updates.append((time.time(), content["data"]["state"]["value"]))
            elif kind in ("execute_result", "display_data"):
                outputs.append(content["data"])
            elif kind == "error":
                error = "\n".join(content["traceback"])
            elif (
                kind == "status"
                and content["execution_state"] == "idle"
                and msg["parent_header"].get("msg_id") == msg_id
            ):
                break
        return opened, updates, outputs, error


CODE = textwrap.dedent(
    """
    import time
    from IPython.display import display
    from workbench_gpu_monitor import GPUMonitor
    m = GPUMonitor(interval=0.5)
    display(m)
    print(m.data_source)
    time.sleep({busy})   # a "training cell": the shell thread is busy
    m.stop()
    """
)


def test_widget_renders_and_updates_while_a_cell_runs():
    opened, updates, outputs, error = run_in_kernel(
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": "GPU-sim-01-h100-80gb"}, CODE.format(busy=3)
    )
    assert error is None, error
    assert opened is not None, "the widget model was never opened"
    initial = opened["data"]["state"]["value"]
    assert "GPU monitor" in initial
    assert "(simulated)" in initial
    assert "cuda:0" in initial
    assert any("application/vnd.jupyter.widget-view+json" in o for o in outputs)
    # ~6 updates in 3 s at 0.5 s, sent while the cell was still sleeping
    assert len(updates) >= 4, updates
    values = {v for _, v in updates}
    assert len(values) >= 3
    assert all("GPU-sim-00" not in v and "80.0 GiB" in v for v in values)


def test_widget_reads_the_servers_snapshot(pinned_server):
    snapshots = list(pinned_server.runtime_dir.glob("gpu-monitor-*.json"))
    assert len(snapshots) == 1
    code = CODE.format(busy=1.5)
    opened, updates, _, error = run_in_kernel(
        {"WORKBENCH_GPU_MONITOR_SNAPSHOT": str(snapshots[0]), "WORKBENCH_SIMULATED_GPUS": "4"}, code
    )
    assert error is None, error
    assert opened is not None
    assert len(updates) >= 2
    # pinned server owns only GPU 2; the kernel sees what the server sees
    assert all("NVIDIA H100" in v for _, v in updates)


def test_render_html_states():
    from workbench_gpu_monitor.widget import render_html

    html = render_html({"source": "none", "state": "no-gpu", "message": "no GPU assigned", "timestamp": 0, "gpus": []})
    assert "no GPU assigned" in html
    gpu = {
        "uuid": "MIG-x",
        "name": "A100 MIG",
        "cuda_index": 0,
        "state": "ok",
        "memory_used_bytes": 39 << 30,
        "memory_total_bytes": 40 << 30,
        "utilization_percent": None,
        "unsupported": {"utilization_percent": "n/a (MIG)"},
        "temperature_c": None,
        "power_w": None,
        "memory_note": "device total, may include other processes",
        "processes": [],
    }
    html = render_html(
        {"source": "nvml", "state": "ok", "timestamp": 0, "gpus": [gpu]},
        [{"cuda_index": 0, "allocated_bytes": 1 << 30, "reserved_bytes": 2 << 30}],
    )
    assert "n/a (MIG)" in html
    assert "#d32f2f" in html
    assert "may include other processes" in html
    assert "torch 1.0 allocated / 2.0 reserved GiB" in html


def test_kernel_answers_torch_memory_on_control_channel_while_busy():
    """The panel's question: answered by the control thread while a cell runs; no torch import forced."""
    with started_kernel({}) as kc:
        reply = kc.execute_interactive("%load_ext workbench_gpu_monitor", timeout=30)
        assert reply["content"]["status"] == "ok"

        def ask():
            msg = kc.session.msg("workbench_gpu_request", {})
            kc.control_channel.send(msg)
            deadline = time.time() + 5
            while time.time() < deadline:
                got = kc.get_control_msg(timeout=5)
                if got["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    return got
            raise AssertionError("no reply")

        got = ask()
        assert got["msg_type"] == "workbench_gpu_reply"
        assert got["content"]["torch_imported"] is False
        assert got["content"]["devices"] == []

        # A fake torch that "uses" CUDA, then a long cell: the control channel still answers.
        fake = textwrap.dedent(
            """
            import sys, types, time
            cuda = types.SimpleNamespace(
                is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1,
                memory_allocated=lambda i: 1 << 30, memory_reserved=lambda i: 3 << 30,
                get_device_properties=lambda i: types.SimpleNamespace(uuid="sim-01"))
            sys.modules["torch"] = types.SimpleNamespace(__version__="0.fake", cuda=cuda)
            time.sleep(4)
            """
        )
        kc.execute(fake)
        time.sleep(1.0)  # the cell is now sleeping
        started = time.time()
        got = ask()
        assert time.time() - started < 2.5
        content = got["content"]
        assert content["torch_imported"] is True
        assert content["devices"] == [
            {"cuda_index": 0, "allocated_bytes": 1 << 30, "reserved_bytes": 3 << 30, "uuid": "GPU-sim-01"}
        ]
