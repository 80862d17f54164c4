"""What the GPU monitor costs a user server, measured on a real ``jupyter server``.

Starts ``jupyter server`` with the workbench_gpu_monitor extension, connects
0, 1, 10 and 50 streaming clients (``api/gpu/stream``) in turn, and reads the
server process's CPU time from /proc over a window for each.  Prints a table
of CPU seconds per minute, the 50:1 ratio (the monitor's promise: one sampler
per server, so clients add only socket writes; target < 1.3), and the latency
of one sample (the source's ``read()`` in process, and a full authenticated
``GET api/gpu/metrics``).

Clients read in two ways, one table each: ``proxy``, one event loop reading
every stream, which is how a user server is reached in a hub (every browser
tab goes through configurable-http-proxy's single Node.js process); and
``threads``, one blocking reader thread per stream on this host, where every
sample wakes 50 threads and the kernel charges much of that wake-up to the
sending server.

    python benchmarks/monitor_overhead.py                     # simulated GPUs, ~2 min
    python benchmarks/monitor_overhead.py --duration 60       # steadier numbers
    python benchmarks/monitor_overhead.py --source nvml       # on a GPU machine

Needs jupyter_server, requests and the extension (installed, or found in
extensions/gpu-monitor of this checkout).  Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
EXTENSION_DIR = REPO / "extensions" / "gpu-monitor"
DEVICES_DIR = REPO / "devices"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all threads (sampler thread included).

    Sums /proc/PID/task/*/schedstat (nanoseconds) rather than /proc/PID/stat
    (clock ticks of 10 ms, too coarse for a process that idles); threads that
    came and went in between are missed, the server's threads are long-lived.
    """
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
                    total += int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return total / 1e9
    except OSError:
        pass
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path, env_overrides: dict, interval: float):
    port, token = free_port(), secrets.token_hex(16)
    (tmp / "config").mkdir()
    (tmp / "config" / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "ServerApp": {"jpserver_extensions": {"workbench_gpu_monitor": True}},
                "GPUMonitorServer": {"sample_interval": interval},
            }
        )
    )
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(EXTENSION_DIR), str(DEVICES_DIR), env.get("PYTHONPATH", "")])),
    )
    env.update(env_overrides)
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
    with open(tmp / "server.log", "w") as log:  # the server keeps its own descriptor of it
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    headers = {"Authorization": f"token {token}"}
    for _ in range(300):
        if proc.poll() is not None:
            sys.exit(f"jupyter server exited; see {tmp / 'server.log'}")
        try:
            if requests.get(url + "api/gpu/metrics", headers=headers, timeout=2).status_code == 200:
                return proc, url, headers
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit("jupyter server did not start")


class StreamClient(threading.Thread):
    def __init__(self, url: str, headers: dict):
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.events = 0
        self.stop = threading.Event()
        self.response = None

    def run(self):
        try:
            with requests.get(self.url + "api/gpu/stream", headers=self.headers, stream=True, timeout=30) as r:
                self.response = r
                for chunk in r.iter_content(chunk_size=None):
                    self.events += chunk.count(b"\n\n")
                    if self.stop.is_set():
                        break
        except (requests.RequestException, OSError):  # closed at the end of a round
            pass

    def close(self):
        self.stop.set()
        if self.response is not None:
            try:
                self.response.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
            except (AttributeError, OSError):  # urllib3 without those internals, or a socket already closed
                self.response.close()


class MultiplexedClients(threading.Thread):
    """Every stream read by one event loop, as configurable-http-proxy reads them in a real hub:
    all browser tabs reach a user server through the proxy's single Node.js process."""

    def __init__(self, url: str, headers: dict, count: int):
        super().__init__(daemon=True)
        parts = urllib.parse.urlsplit(url)
        request = (
            f"GET {parts.path}api/gpu/stream HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n"
        ).encode()
        self.selector = selectors.DefaultSelector()
        self.sockets = []
        for _ in range(count):
            sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
            sock.sendall(request)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.sockets.append(sock)
        self.events = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                try:
                    data = key.fileobj.recv(65536)
                except (BlockingIOError, ConnectionError):
                    continue
                self.events += data.count(b"\n\n")

    def close(self):
        self.stop.set()
        self.join(5)
        for sock in self.sockets:
            self.selector.unregister(sock)
            sock.close()


class ThreadedClients:
    """One blocking reader thread per stream: clients on the server's own host without a proxy."""

    def __init__(self, url: str, headers: dict, count: int):
        self.pool = [StreamClient(url, headers) for _ in range(count)]

    @property
    def events(self) -> int:
        return sum(c.events for c in self.pool)

    def start(self):
        for c in self.pool:
            c.start()

    def close(self):
        for c in self.pool:
            c.close()
        for c in self.pool:
            c.join(5)


READERS = {"proxy": MultiplexedClients, "threads": ThreadedClients}


def measure(pid, url, headers, clients: int, duration: float, warmup: float, readers: str) -> dict:
    pool = READERS[readers](url, headers, clients)
    pool.start()
    time.sleep(warmup)
    events0 = pool.events
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(duration)
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    events = pool.events - events0
    stats = requests.get(url + "api/gpu/metrics", headers=headers, timeout=10).json().get("monitor", {})
    pool.close()
    time.sleep(1.0)  # let the server notice the closed sockets before the next round
    elapsed = t1 - t0
    return {
        "readers": readers,
        "clients": clients,
        "cpu_s_per_min": (cpu1 - cpu0) / elapsed * 60,
        "events_per_client_s": events / clients / elapsed if clients else 0.0,
        "sample_ms": stats.get("sample_ms"),
        "fanout_ms": stats.get("fanout_ms"),
    }


def sample_latency(env_overrides: dict, n: int = 200) -> tuple[float, float, str]:
    sys.path.insert(0, str(DEVICES_DIR))
    from workbench_devices import make_source

    env = dict(os.environ)
    env.update(env_overrides)
    source = make_source(env)
    source.read()  # NVML init happens once, not per sample
    times = []
    for _ in range(n):
        t = time.perf_counter()
        source.read()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[int(0.95 * (n - 1))], source.read()["source"]


def http_latency(url: str, headers: dict, n: int = 50) -> tuple[float, float]:
    session = requests.Session()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        session.get(url + "api/gpu/metrics", headers=headers, timeout=10).raise_for_status()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[int(0.95 * (n - 1))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="0,1,10,50", help="comma list of client counts (default 0,1,10,50)")
    parser.add_argument(
        "--duration", type=float, default=20.0, help="measuring window per client count, s (default 20)"
    )
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds after connecting before measuring")
    parser.add_argument("--interval", type=float, default=1.0, help="sampler interval, s (default 1)")
    parser.add_argument("--source", choices=["simulated", "nvml"], default="simulated")
    parser.add_argument("--gpus", default="4", help="WORKBENCH_SIMULATED_GPUS for --source simulated")
    parser.add_argument("--pin", default=None, help="WORKBENCH_GPUS for the server (default: first simulated GPU)")
    parser.add_argument(
        "--readers",
        default="proxy,threads",
        help="how the clients read, comma list: proxy (one event loop for every stream, as "
        "configurable-http-proxy does) and/or threads (a blocking thread per stream)",
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args(argv)

    env = {}
    if args.source == "simulated":
        env["WORKBENCH_SIMULATED_GPUS"] = args.gpus
        env["WORKBENCH_GPUS"] = args.pin if args.pin is not None else "GPU-sim-00-h100-80gb"
    else:
        env["WORKBENCH_SIMULATED_GPUS"] = ""
        if args.pin is not None:
            env["WORKBENCH_GPUS"] = args.pin

    counts = [int(c) for c in args.clients.split(",")]
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = sorted(set(readers) - set(READERS))
    if unknown or not readers:
        parser.error(f"--readers takes proxy and/or threads, not {args.readers!r}")
    with tempfile.TemporaryDirectory(prefix="monitor-bench-") as tmp:
        proc, url, headers = start_server(Path(tmp), env, args.interval)
        try:
            time.sleep(2)
            rows = [
                measure(proc.pid, url, headers, n, args.duration, args.warmup, how) for how in readers for n in counts
            ]
            http_med, http_p95 = http_latency(url, headers)
        finally:
            proc.terminate()
            proc.wait(15)
    read_med, read_p95, source = sample_latency(env)

    print(f"GPU monitor overhead: source={source}, interval={args.interval}s, window={args.duration}s per row")
    ratios = {}
    for how in readers:
        print(f"\nclients read by {'one event loop (as through the proxy)' if how == 'proxy' else 'a thread each'}:")
        print(f"{'clients':>8} | {'server CPU s/min':>16} | {'events/client/s':>15} | {'fan-out ms/sample':>17}")
        print(f"{'-' * 8}-+-{'-' * 16}-+-{'-' * 15}-+-{'-' * 17}")
        by = {}
        for r in (r for r in rows if r["readers"] == how):
            by[r["clients"]] = r
            fanout = "n/a" if r["fanout_ms"] is None else f"{r['fanout_ms']:.3f}"
            print(f"{r['clients']:>8} | {r['cpu_s_per_min']:>16.3f} | {r['events_per_client_s']:>15.2f} | {fanout:>17}")
        if 1 in by and 50 in by and by[1]["cpu_s_per_min"] > 0:
            ratios[how] = by[50]["cpu_s_per_min"] / by[1]["cpu_s_per_min"]
            verdict = "OK" if ratios[how] < 1.3 else "ABOVE TARGET"
            print(f"ratio 50:1 clients = {ratios[how]:.2f} (target < 1.3: {verdict})")
    print()
    print(f"one sample, source.read(): median {read_med * 1e3:.3f} ms, p95 {read_p95 * 1e3:.3f} ms")
    print(f"GET api/gpu/metrics:       median {http_med * 1e3:.2f} ms, p95 {http_p95 * 1e3:.2f} ms")
    if args.json:
        print(json.dumps({"rows": rows, "ratio_50_1": ratios, "read_median_s": read_med, "http_median_s": http_med}))


if __name__ == "__main__":
    main()
