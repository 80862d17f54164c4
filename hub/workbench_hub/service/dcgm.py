"""A MIG slice's utilization from the site's dcgm-exporter: the one reading of a slice that is honest.

NVML has no utilization for a MIG slice (``nvidia-smi`` shows N/A), and idle
reclaim never counts a missing reading as idle, so without this a slice has
no idle rule. DCGM measures each GPU instance with its profiling field
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the share of time the instance's graphics
engine was busy, a ratio 0..1), and dcgm-exporter publishes it in
Prometheus' text format with these labels on a slice's series::

    DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-5f3c…",device="nvidia0",modelName="NVIDIA H200",
        GPU_I_PROFILE="1g.18gb",GPU_I_ID="9",Hostname="gpu-node-1",DCGM_FI_DRIVER_VERSION="550.90.07"} 0.43

``UUID`` is the *parent* GPU's (DCGM does not know MIG UUIDs), so a slice is
found by its parent's UUID and its GPU instance id (``GPUDevice.parent_uuid``
and ``.gpu_instance_id``, from NVML's ``nvmlDeviceGetGpuInstanceId``). The
ratio becomes a percent, as every other reading is.

Configure it with ``dcgm_exporter_urls`` (``WORKBENCH_DCGM_EXPORTER_URL``),
which the hub stores with its policy settings; the service reads the URLs
from there. Only slices read from here: a whole GPU keeps NVML's reading (or
its server's monitor), which needs nothing from the site and is the number
``nvidia-smi`` shows, so existing idle rules keep meaning what they meant.

Nothing here ever makes a slice idle by accident: an exporter that does not
answer within ``TIMEOUT`` seconds, a slice without a series, a value that is
not a number in 0..1, a sample whose timestamp is older than ``MAX_AGE``: each
is "no reading" (None) with a reason the fleet page shows, and the log says
so once, not every pass. Exporters are read in threads (never on the event
loop), in parallel, at most once per ``CACHE_SECONDS`` for everyone (the
reclaim pass and the fleet page share one scrape), and never through
``$http_proxy``: they are on the site's own GPU nodes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from workbench_devices import GPUDevice

log = logging.getLogger("workbench.service")

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
TIMEOUT = 2.0  # seconds per exporter: a pass or a page never waits long for a node that is down
CACHE_SECONDS = 2.0
MAX_AGE = 120.0  # a sample stamped older than this (seconds) is stale; dcgm-exporter stamps none by default
MAX_BYTES = 16 << 20

# Why a slice has no reading (the fleet page and api/gpus show these words).
NOT_CONFIGURED = "no exporter configured"
UNREACHABLE = "exporter unreachable"
NO_SERIES = "no series for this slice"
STALE = "stale reading"
MALFORMED = "malformed reading"
NO_INSTANCE_ID = "GPU instance id unknown"

_OURS = re.compile(rf"{GR_ENGINE_ACTIVE}[{{\s]")  # this metric's sample lines; the parser reads them
Key = tuple[str, "int | None"]  # (the GPU's UUID, the slice's GPU instance id; None for a whole GPU)


@dataclass(frozen=True)
class Sample:
    """One series' value as a percent, or None with the problem (``STALE``, ``MALFORMED``)."""

    percent: float | None
    problem: str = ""


def key_of(device: GPUDevice) -> Key | None:
    """Where dcgm-exporter puts ``device``: its GPU's UUID and its instance id (None: cannot be found)."""
    if not device.mig:
        return (device.uuid, None)
    if not device.parent_uuid or device.gpu_instance_id is None:
        return None
    return (device.parent_uuid, int(device.gpu_instance_id))


def _instance_id(labels: dict[str, str]) -> int | str | None:
    raw = (labels.get("GPU_I_ID") or labels.get("gpu_i_id") or "").strip()
    if not raw:
        return None
    return int(raw) if raw.isdigit() else "bad"


def _sample(value: float, timestamp, now: float) -> Sample:
    if not math.isfinite(value) or not -1e-6 <= value <= 1.001:
        return Sample(None, MALFORMED)
    if timestamp is not None and now - float(timestamp) > MAX_AGE:
        return Sample(None, STALE)
    return Sample(round(min(1.0, max(0.0, value)) * 100, 1))


def parse_exporter_text(text: str, now: float | None = None) -> tuple[dict[Key, Sample], int]:
    """The ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` series of one exporter's answer, by (GPU UUID, instance id),
    and how many of its lines could not be read.

    Only that metric's lines are handed to prometheus_client's parser, one at a time: a bad line
    elsewhere in the answer (or a bad line of this metric) costs only itself. The first series for a
    key wins."""
    now = time.time() if now is None else now
    found: dict[Key, Sample] = {}
    unreadable = 0
    for line in text.splitlines():
        stripped = line.strip()
        if not _OURS.match(stripped):
            continue
        try:
            samples = [s for family in text_string_to_metric_families(stripped + "\n") for s in family.samples]
        except ValueError:
            # A value the parser cannot read ("abc"): the parser names no labels, so the series is lost.
            unreadable += 1
            continue
        for sample in samples:
            labels = sample.labels
            uuid = (labels.get("UUID") or labels.get("uuid") or "").strip()
            instance = _instance_id(labels)
            if not uuid or isinstance(instance, str):  # "bad": an id that is not a number
                unreadable += 1
                continue
            found.setdefault((uuid, instance), _sample(float(sample.value), sample.timestamp, now))
    return found, unreadable


@dataclass
class Scrape:
    """All exporters' series at one moment, and which exporters failed (URL -> why)."""

    urls: tuple[str, ...]
    samples: dict[Key, Sample] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unreadable: dict[str, int] = field(default_factory=dict)
    at: float = 0.0

    def reading(self, device: GPUDevice) -> tuple[float | None, str]:
        """(percent, "") for a device with a good series, else (None, why)."""
        key = key_of(device)
        if key is None:
            return None, NO_INSTANCE_ID
        sample = self.samples.get(key)
        if sample is not None:
            return sample.percent, sample.problem
        if self.failed:
            # Its exporter may be the one that did not answer: say that, not "no series".
            return None, UNREACHABLE
        return None, MALFORMED if self.unreadable else NO_SERIES


def fetch(url: str, timeout: float = TIMEOUT) -> str:
    """One exporter's answer; raises OSError (or ValueError) with the reason. Never through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with opener.open(request, timeout=timeout) as answer:
        body = answer.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError(f"answer larger than {MAX_BYTES >> 20} MiB")
    return body.decode("utf-8", errors="replace")


class DcgmExporters:
    """The exporters' answers, shared by the reclaim pass and the fleet page (blocking: call in a thread)."""

    def __init__(
        self,
        fetch: Callable[[str], str] = fetch,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        cache_seconds: float = CACHE_SECONDS,
    ):
        self._fetch = fetch
        self._clock = clock
        self._wall = wall
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._last: Scrape | None = None
        self._down: set[str] = set()  # exporters whose failure was logged (logged again once back)
        self._garbled: set[str] = set()

    def scrape(self, urls: Sequence[str]) -> Scrape:
        """Every exporter's series, read at most once per ``cache_seconds`` whoever asks."""
        urls = tuple(urls)
        with self._lock:  # one scrape at a time: a page refresh during a pass waits for the pass's
            last = self._last
            if last is not None and last.urls == urls and self._clock() - last.at < self.cache_seconds:
                return last
            scrape = Scrape(urls, at=self._clock())
            now = self._wall()
            with ThreadPoolExecutor(max_workers=min(8, max(1, len(urls)))) as pool:
                answers = list(pool.map(self._try_fetch, urls))
            for url, (text, error) in zip(urls, answers, strict=True):
                if error:
                    scrape.failed[url] = error
                    continue
                samples, unreadable = parse_exporter_text(text, now)
                for key, sample in samples.items():
                    scrape.samples.setdefault(key, sample)
                if unreadable:
                    scrape.unreadable[url] = unreadable
            self._log_changes(scrape)
            self._last = scrape
            return scrape

    def _try_fetch(self, url: str) -> tuple[str, str]:
        try:
            return self._fetch(url), ""
        except (OSError, ValueError) as exc:  # refused, timed out, HTTP 5xx, too large: all "unreachable"
            return "", str(exc) or exc.__class__.__name__

    def _log_changes(self, scrape: Scrape) -> None:
        for url in scrape.urls:
            if url in scrape.failed and url not in self._down:
                log.warning(
                    "dcgm-exporter %s unreachable (%s): the MIG slices it reports have no utilization reading, "
                    "so no idle rule, until it answers",
                    url,
                    scrape.failed[url],
                )
                self._down.add(url)
            elif url not in scrape.failed and url in self._down:
                log.info("dcgm-exporter %s answers again", url)
                self._down.discard(url)
            if url in scrape.unreadable and url not in self._garbled:
                log.warning(
                    "dcgm-exporter %s: %d %s line(s) could not be read; their slices have no reading",
                    url,
                    scrape.unreadable[url],
                    GR_ENGINE_ACTIVE,
                )
                self._garbled.add(url)
            elif url not in scrape.unreadable:
                self._garbled.discard(url)


class DcgmReadings:
    """Idle reclaim's source for a lease that holds MIG slices, where exporters are configured.

    Slices read from the exporters; any whole GPU of the same lease from ``fallback``, the source the
    chooser would have taken without slices. A slice without a reading is logged once per reason."""

    name = "dcgm"

    def __init__(self, fleet, fallback=None, logged: set[tuple[str, str]] | None = None):
        self.fleet = fleet
        self.fallback = fallback
        self._logged: set[tuple[str, str]] = set() if logged is None else logged

    def over(self, fallback) -> DcgmReadings:
        """This source, reading a lease's whole GPUs from ``fallback`` (shares what was logged)."""
        return DcgmReadings(self.fleet, fallback, self._logged)

    def covers(self, lease) -> bool:
        """Whether ``lease`` holds a slice and the hub named exporters to read it from."""
        if not self.fleet.settings.dcgm_exporter_urls:
            return False
        devices = self.fleet.inventory.by_uuid()
        return any(devices.get(uuid) is not None and devices[uuid].mig for uuid in lease.gpu_uuids)

    async def read(self, lease, server_path: str | None) -> dict[str, float | None]:
        devices = await asyncio.to_thread(lambda: self.fleet.inventory.by_uuid())
        scrape = await asyncio.to_thread(self.fleet.dcgm_scrape)
        slices = [uuid for uuid in lease.gpu_uuids if devices.get(uuid) is not None and devices[uuid].mig]
        out: dict[str, float | None] = {}
        if len(slices) < len(lease.gpu_uuids) and self.fallback is not None:
            out.update(await self.fallback.read(lease, server_path))
        for uuid in lease.gpu_uuids:
            if uuid not in slices:
                out.setdefault(uuid, None)
                continue
            percent, why = scrape.reading(devices[uuid]) if scrape is not None else (None, NOT_CONFIGURED)
            out[uuid] = percent
            if percent is None and (uuid, why) not in self._logged:
                log.warning(
                    "No DCGM reading for MIG slice %s of %s: %s", uuid, f"{lease.user}/{lease.server or 'default'}", why
                )
                self._logged.add((uuid, why))
            elif percent is not None:
                self._logged -= {key for key in self._logged if key[0] == uuid}
        return out
