"""The jupyter-server side: one sampler per server, a JSON snapshot and one SSE stream.

Endpoints (all need the server's normal authentication: token, cookie or the
JupyterHub OAuth cookie; unauthenticated requests get 403):

``GET {base_url}api/gpu/metrics``
    The latest sample (shape: "Snapshot shape" in extensions/gpu-monitor/README.md).  ``?history=1`` adds the
    last ten minutes as per-GPU arrays, so a panel opened late can draw them.
``GET {base_url}api/gpu/memory``
    The server's memory cgroup: limit, usage, OOM kills and when they last rose
    (``memory_cgroup.py``), so the lab can say why a kernel died.
``GET {base_url}api/gpu/stream``
    ``text/event-stream``; one ``data: {...}`` event per sample, the same
    bytes to every client.  The sampler thread produces the sample, the event
    loop serialises it once and writes it to each open stream; a client never
    causes an NVML call, so ten tabs cost what one costs plus a socket write.

Configure with ``c.GPUMonitorServer.<trait>`` in ``jupyter_server_config.py``.
``GPUMonitorApp`` (``app.py``) registers the handlers and starts and stops the
monitor with the server.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import tempfile
import time

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.iostream import IOStream, StreamClosedError
from traitlets import Bool, Float, Unicode, default
from traitlets.config import LoggingConfigurable

from workbench_devices import make_source

from .sampler import MIN_INTERVAL_SECONDS, SNAPSHOT_ENV, Sampler, compact_history

MAX_CLIENT_BACKLOG_BYTES = 1 << 20
MEMORY_KEY = "workbench_gpu_monitor_memory"
# Where the server's one monitor lives: its tornado settings, which every handler reads.
# (Not "workbench_gpu_monitor": ExtensionApp keeps the GPUMonitorApp under its name.)
SETTINGS_KEY = "workbench_gpu_monitor_server"


class GPUMonitorServer(LoggingConfigurable):
    """Owns the sampler thread and the list of open streams of one Jupyter server."""

    sample_interval = Float(
        1.0,
        config=True,
        help=f"""Seconds between two GPU readings.

        One reading serves every open browser tab, notebook widget and API
        client, so this is the only knob that changes the monitor's cost.
        Values below {MIN_INTERVAL_SECONDS} s are raised to it: clients cannot
        ask for faster sampling.  Example: ``c.GPUMonitorServer.sample_interval = 2``
        on a busy shared host.
        """,
    )

    history_seconds = Float(
        600.0,
        config=True,
        help="""How much history the server keeps for charts (seconds).

        The side panel asks for it when it opens, so the charts show the last
        ten minutes even if the panel was closed.  Memory cost is one small
        dict per GPU per sample.
        """,
    )

    write_snapshot_file = Bool(
        True,
        config=True,
        help="""Write each sample to a file that notebook kernels can read.

        The ipywidgets ``GPUMonitor`` in a kernel reads this file rather than
        opening NVML itself, so the widget shows exactly what the status bar
        shows and the server stays the only sampler.  The path is passed to
        kernels in the ``WORKBENCH_GPU_MONITOR_SNAPSHOT`` environment variable.
        Turn off on read-only runtime directories.
        """,
    )

    snapshot_path = Unicode(
        config=True,
        help="""Where to write the snapshot file (see ``write_snapshot_file``).

        Defaults to ``gpu-monitor-<pid>.json`` in the Jupyter runtime directory.
        """,
    )

    @default("snapshot_path")
    def _default_snapshot_path(self):
        runtime_dir = getattr(self.parent, "runtime_dir", None) or tempfile.gettempdir()
        return os.path.join(runtime_dir, f"gpu-monitor-{os.getpid()}.json")

    def __init__(self, serverapp=None, source=None, **kwargs):
        super().__init__(parent=serverapp, **kwargs)
        self.serverapp = serverapp
        self.sampler = Sampler(source or make_source(), self.sample_interval, self.history_seconds)
        self.clients: set[GPUStreamHandler] = set()
        self.latest_payload: bytes | None = None
        self.latest: dict | None = None
        self.last_fanout = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    # -- life cycle -----------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_event_loop()
        self.sampler.add_listener(self._from_thread)
        if self.write_snapshot_file:
            os.environ[SNAPSHOT_ENV] = self.snapshot_path  # kernels started later inherit it
            atexit.register(self._remove_snapshot)
        self.sampler.start()
        s = self.sampler.latest or {}
        self.log.info(
            "GPU monitor: %s source, %d GPU(s), every %.2fs%s",
            s.get("source"),
            len(s.get("gpus", [])),
            self.sampler.interval,
            f" ({s.get('message')})" if s.get("message") else "",
        )

    def stop(self) -> None:
        """Stop the sampler thread, end the open streams and remove the snapshot file; once."""
        if self._stopped:
            return
        self._stopped = True
        self.sampler.stop()
        for client in list(self.clients):
            client.close_stream()
        self._remove_snapshot()
        self.log.info("GPU monitor: sampler stopped after %d sample(s)", self.sampler.samples_taken)

    def _remove_snapshot(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.snapshot_path)

    # -- fan-out --------------------------------------------------------
    def _from_thread(self, sample: dict) -> None:
        if self.write_snapshot_file:
            self._write_snapshot(sample)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing during shutdown
                loop.call_soon_threadsafe(self._publish, sample)

    def _write_snapshot(self, sample: dict) -> None:
        tmp = f"{self.snapshot_path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(sample, fh)
            os.replace(tmp, self.snapshot_path)
        except OSError as exc:
            self.log.warning("GPU monitor: cannot write %s: %s", self.snapshot_path, exc)
            self.write_snapshot_file = False

    def kernel_activity(self) -> dict:
        """How many kernels run and how many are busy: input for the idle-GPU hint."""
        manager = getattr(self.serverapp, "kernel_manager", None)
        busy = total = 0
        if manager is not None:
            for kernel_id in manager.list_kernel_ids():
                try:
                    state = manager.get_kernel(kernel_id).execution_state
                except (KeyError, web.HTTPError):  # a kernel that just died: no such kernel any more
                    continue
                total += 1
                busy += state == "busy"
        return {"busy": busy, "total": total}

    def _publish(self, sample: dict) -> None:
        started = time.perf_counter()
        sample = dict(
            sample,
            kernels=self.kernel_activity(),
            monitor={
                "clients": len(self.clients),
                "sample_ms": round(self.sampler.last_duration * 1e3, 3),
                "fanout_ms": round(self.last_fanout * 1e3, 3),
            },
        )
        self.latest = sample
        payload = b"data: " + json.dumps(sample, separators=(",", ":")).encode() + b"\n\n"
        self.latest_payload = payload
        # Serialise and frame once; every client gets the same bytes.
        chunk = b"%x\r\n%s\r\n" % (len(payload), payload)
        for client in list(self.clients):
            client.push(payload, chunk)
        self.last_fanout = time.perf_counter() - started

    def snapshot(self, history: bool = False) -> dict:
        sample = self.latest or self.sampler.latest or {}
        out = dict(sample)
        out.setdefault("kernels", self.kernel_activity())
        if history:
            out["history"] = compact_history(self.sampler.history_since(time.time() - self.history_seconds))
        return out


class _MonitorHandler(APIHandler):
    """Authenticated like the rest of the server's API; reads the one shared sampler."""

    auth_resource = "api"

    @property
    def monitor(self) -> GPUMonitorServer:
        return self.settings[SETTINGS_KEY]


class GPUMetricsHandler(_MonitorHandler):
    @web.authenticated
    @authorized
    async def get(self):
        history = self.get_argument("history", "0").lower() in ("1", "true", "yes")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self.monitor.snapshot(history=history)))


class GPUStreamHandler(_MonitorHandler):
    """Server-sent events: one ``data:`` line per sample until the client goes away."""

    @web.authenticated
    @authorized
    async def get(self):
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")  # no proxy buffering (nginx)
        self._closed = asyncio.Event()
        monitor = self.monitor
        first = monitor.latest_payload
        if first is None and monitor.sampler.latest is not None:
            monitor._publish(monitor.sampler.latest)
            first = monitor.latest_payload
        self.write(b"retry: 2000\n\n")
        if first is not None:
            self.write(first)
        try:
            await self.flush()
        except StreamClosedError:
            return
        # Fast path: once the headers are out, each sample is one pre-framed
        # HTTP/1.1 chunk.  With nothing queued in tornado's buffer it goes
        # straight to the socket with one send() (about 9 us here, against
        # about 50 us through IOStream.write, which was most of the
        # per-client cost; see benchmarks/monitor_overhead.py); whatever the
        # kernel does not take at once is queued in the stream, and later
        # chunks follow it there, so the byte order never changes.  TLS
        # streams and HTTP/1.0 (no chunking) use plain write()/flush().
        #
        # Tornado has no public API for this: RequestHandler.write/flush and
        # IOStream.write always buffer, make a Future and go through the
        # stream's write machinery, which is the cost being avoided, and no
        # public call sends without that.  So the fast path uses only public
        # attributes (HTTP1Connection.stream, IOStream.socket, .writing(),
        # .closed(), .write()) and decides chunking the way tornado does: an
        # HTTP/1.1 request, a 200 without Content-Length (never set here).
        connection = self.request.connection
        stream = getattr(connection, "stream", None)
        chunked = self.request.version == "HTTP/1.1" and isinstance(stream, IOStream)
        self._raw_stream = stream if chunked else None
        # SSLIOStream is an IOStream too, but its socket would bypass TLS.
        self._raw_socket = stream.socket if chunked and type(stream) is IOStream else None
        self._queued_bytes = 0  # what we handed the stream and it has not sent yet
        monitor.clients.add(self)
        try:
            await self._closed.wait()
        finally:
            monitor.clients.discard(self)
        # finish() twice is a RuntimeError; a connection that is gone, a StreamClosedError
        with contextlib.suppress(RuntimeError, StreamClosedError):
            self.finish()

    def push(self, payload: bytes, chunk: bytes | None = None) -> None:
        if self._closed.is_set():
            return
        try:
            stream = self._raw_stream
            if stream is not None and chunk is not None:
                if stream.closed():
                    raise StreamClosedError()
                # A client that stopped reading: drop it rather than buffer forever.
                if self._queued_bytes > MAX_CLIENT_BACKLOG_BYTES:
                    raise StreamClosedError()
                sent = 0
                if self._raw_socket is not None and not stream.writing():
                    try:
                        sent = self._raw_socket.send(chunk)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    except OSError as exc:  # reset or broken pipe: the client is gone
                        raise StreamClosedError() from exc
                if sent < len(chunk):
                    rest = len(chunk) - sent
                    self._queued_bytes += rest
                    stream.write(chunk[sent:]).add_done_callback(lambda f: self._sent(f, rest))
            else:
                self.write(payload)
                self.flush().add_done_callback(self._flushed)
        except (StreamClosedError, RuntimeError):
            self.close_stream()

    def _sent(self, future, size: int) -> None:
        self._queued_bytes -= size
        self._flushed(future)

    def _flushed(self, future) -> None:
        if future.exception() is not None:
            self.close_stream()

    def close_stream(self) -> None:
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()

    def on_connection_close(self):
        self.close_stream()


class MemoryCgroupHandler(APIHandler):
    """The memory watcher's latest reading (``memory_cgroup.MemoryWatcher``)."""

    auth_resource = "api"

    @web.authenticated
    @authorized
    async def get(self):
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self.settings[MEMORY_KEY].snapshot()))
