"""Step 2c: jupyterlab-nvdashboard's server CPU per minute with 1, 10 and 50 clients, beside ours.

nvdashboard (NVIDIA's JupyterLab GPU dashboard) has no shared sampler: each open websocket
gets its own PeriodicCallback that reads NVML every second.  This starts ``jupyter server``
with only the ``jupyterlab_nvdashboard`` server extension, opens N websockets to
``nvdashboard/gpu_resource`` (its main panel) in one event loop, as the hub's proxy would, and
reads the server's CPU time the way ``benchmarks/monitor_overhead.py`` does (same function).

    python -m gpu_check.nvdashboard_overhead RAWDIR [--clients 1,10,50] [--duration 10]

Needs the jupyterlab_nvdashboard package (carried as a wheel, server part only: jupyterlab
itself is not needed to serve the websockets) and a GPU; otherwise it writes why it skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import DRY
from .report import fmt, table, write

ENDPOINT = "nvdashboard/gpu_resource"


def skip(raw: Path, reason: str) -> None:
    print(f"nvdashboard: skipped: {reason}", flush=True)
    write(
        raw, "nvdashboard", {"skipped": reason}, ["### 2c. jupyterlab-nvdashboard beside it", "", f"Skipped: {reason}"]
    )


async def measure(pid: int, port: int, token: str, clients: int, duration: float, warmup: float, cpu_seconds) -> dict:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{port}/{ENDPOINT}"
    conns = [
        await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"})) for _ in range(clients)
    ]
    counts = [0] * clients
    stop = asyncio.Event()

    async def reader(i, conn):
        while not stop.is_set():
            msg = await conn.read_message()
            if msg is None:
                return
            counts[i] += 1

    tasks = [asyncio.ensure_future(reader(i, c)) for i, c in enumerate(conns)]
    await asyncio.sleep(warmup)
    n0, c0, t0 = sum(counts), cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(duration)
    n1, c1, t1 = sum(counts), cpu_seconds(pid), time.monotonic()
    stop.set()
    for c in conns:
        c.close()
    await asyncio.sleep(0.5)
    for t in tasks:
        t.cancel()
    await asyncio.sleep(1.0)
    return {
        "clients": clients,
        "cpu_s_per_min": (c1 - c0) / (t1 - t0) * 60,
        "messages_per_client_s": (n1 - n0) / clients / (t1 - t0),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw")
    parser.add_argument("--clients", default="1,10,50")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args()
    raw = Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    if DRY:
        return skip(
            raw, "dry run: nvdashboard needs a real GPU (it registers its GPU websockets only when NVML finds one)"
        )
    if importlib.util.find_spec("jupyterlab_nvdashboard") is None:
        return skip(
            raw,
            "jupyterlab_nvdashboard is not importable: carry its wheel (benchmarks/gpu_check_wheels.sh puts it "
            "in .whl/)",
        )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from monitor_overhead import cpu_seconds, free_port  # the same CPU accounting as our monitor's figures

    port, token = free_port(), secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="nvdashboard-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "config").mkdir()
        (tmp / "config" / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"jupyterlab_nvdashboard": True}}})
        )
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
        cmd = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp}",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        with open(raw / "nvdashboard-server.log", "w") as log:  # the server keeps its own descriptor of it
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            import requests

            status = None
            for _ in range(150):
                if proc.poll() is not None:
                    return skip(
                        raw, f"jupyter server with nvdashboard exited {proc.returncode}; see nvdashboard-server.log"
                    )
                try:
                    r = requests.get(
                        f"http://127.0.0.1:{port}/nvdashboard/accelerators/check",
                        headers={"Authorization": f"token {token}"},
                        timeout=2,
                    )
                    if r.status_code == 200:
                        status = r.json()
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.2)
            if status is None:
                return skip(raw, "nvdashboard's server did not answer nvdashboard/accelerators/check")
            if not status.get("ngpus"):
                return skip(raw, f"nvdashboard found no GPU ({status}): its GPU websockets are not registered")
            time.sleep(2)
            rows = [
                asyncio.run(measure(proc.pid, port, token, int(n), args.duration, args.warmup, cpu_seconds))
                for n in args.clients.split(",")
            ]
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    by = {r["clients"]: r for r in rows}
    ratio = (
        by[50]["cpu_s_per_min"] / by[1]["cpu_s_per_min"] if 1 in by and 50 in by and by[1]["cpu_s_per_min"] else None
    )
    lines = [
        "### 2c. jupyterlab-nvdashboard beside it",
        "",
        f"jupyterlab_nvdashboard {_version()}, websockets to `{ENDPOINT}` read by one event loop, "
        f"{args.duration:g} s per row; ngpus {status.get('ngpus')}",
        "",
        *table(
            ["clients", "server CPU s/min", "messages/client/s"],
            [[r["clients"], fmt(r["cpu_s_per_min"], 3), fmt(r["messages_per_client_s"], 2)] for r in rows],
        ),
        "",
        f"ratio 50:1 clients = {fmt(ratio, 2)} (ours: see the monitor_overhead table above)",
    ]
    write(raw, "nvdashboard", {"rows": rows, "ratio_50_1": ratio, "status": status, "version": _version()}, lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jupyterlab-nvdashboard")
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
