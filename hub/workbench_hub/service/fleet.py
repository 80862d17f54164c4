"""The fleet as the workbench service shows it: GPUs, who holds them, live readings, quota summaries.

Everything here is read from the GPU database the hub writes:

* the **policy settings** (inventory, static GPUs included, servers per
  GPU, the default quota, the node name) that the hub resolved from its
  configuration at start and stored (``workbench_spawner.policy.settings``). The
  service never derives them itself, so a setting made only as a trait
  (``c.GPUSpawnerMixin.default_max_gpus = 2``) shows here as it is enforced.
  The row's ``updated`` stamp is looked at every few seconds; a hub restart
  with other settings is picked up without restarting the service. Before
  any hub stored them, ``SettingsMissingError`` tells the handlers to answer 503;
* the **leases** (who holds which GPU on which node, since when) and the
  **drains** (GPUs closed to new servers, ``drain_book.py``);
* the **layout changes waiting** (``inventory_refresh.py``): a GPU whose
  re-read MIG layout would take devices from running servers keeps its old
  layout, closed to new servers, until they stop; each of its rows says so;
* the **quota book** and the GPU-hours ledger;
* the **inventory as the backend knows it**, re-read with the settings
  (the backend extension's ``resolve_inventory``: on Slurm the UUIDs jobs
  reported for each node's GPUs, so a real GPU shows under the UUID its
  lease holds), and the backend's annotations of each GPU row
  (``annotate_fleet``: on Slurm, the node's state). The service names no
  backend: the hub published which one runs.

Live utilization and memory come from ``workbench_devices`` (NVML, or the
simulated readings for a simulated inventory), cached for a second; a MIG
slice's utilization from the hub's dcgm-exporters where it names any
(``dcgm.py``: ``reading_source`` "dcgm"), and where a held slice has none,
``no_reading_reason`` says why (no exporter configured, exporter unreachable,
no series for this slice...): it has no idle rule then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import date, datetime

from sqlalchemy import select

from workbench_devices import DeviceInventory, NVMLSource, SimulatedSource
from workbench_spawner.backend import extension_of
from workbench_spawner.ledger.drain_book import DrainBook, is_drained
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, utcnow
from workbench_spawner.policy.clock import hub_clock, zone
from workbench_spawner.policy.inventory_refresh import load_layout_waiting
from workbench_spawner.policy.settings import POLICY_KEY, PolicySettings, load_policy_settings
from workbench_spawner.rules.quota import Quota

from .dcgm import NOT_CONFIGURED, DcgmExporters, Scrape

log = logging.getLogger("workbench.service")

NO_SETTINGS = (
    "the hub has not published its GPU settings yet (it writes them to the GPU database when it "
    "starts); try again in a few seconds, and if this persists check that the hub and this service "
    "use the same database (--db-url)"
)


class SettingsMissingError(Exception):
    """No hub has stored its policy settings in this database yet."""

    def __str__(self) -> str:
        return NO_SETTINGS


class Fleet:
    """The store, the quota book, the hub's stored settings and live readings."""

    def __init__(self, store: AllocationStore, settings: PolicySettings | None = None, refresh_seconds: float = 2.0):
        self.store = store
        self.book = QuotaBook(store, today=self.today)
        self.refresh_seconds = refresh_seconds
        self._settings = settings
        self._updated: datetime | None = None
        # Settings handed in directly (tests) are never replaced by the database's.
        self._fixed = settings is not None
        self._checked_at = 0.0
        self._lock = threading.Lock()
        self._source: SimulatedSource | NVMLSource | None = None
        self._reading: dict | None = None
        self._reading_at = 0.0
        self._inventory: DeviceInventory | None = None  # the backend's view, refreshed with the settings
        self.dcgm = DcgmExporters()  # MIG slices' readings, shared by the page and idle reclaim

    # -- the hub's settings ----------------------------------------------------------

    def refresh(self) -> PolicySettings | None:
        """Re-read the settings row if its ``updated`` stamp changed (looked at every few seconds)."""
        if self._fixed:
            return self._settings
        with self._lock:
            if self._settings is not None and time.monotonic() - self._checked_at < self.refresh_seconds:
                return self._settings
            with self.store.reads()() as session:
                updated = session.scalar(select(SettingsRow.updated).where(SettingsRow.key == POLICY_KEY))
            self._checked_at = time.monotonic()
            if updated is None:
                return self._settings
            if self._settings is None or updated != self._updated:
                loaded = load_policy_settings(self.store)
                if loaded is not None:
                    if self._settings is not None:
                        log.info("The hub published new GPU settings (%s); using them", loaded[1].isoformat())
                    self._settings, _ = loaded
                    self._updated = updated
                    self._source, self._reading = None, None
            if self._settings is not None:
                extension = extension_of(self._settings.backend)
                self._inventory = (
                    extension.resolve_inventory(self.store, self._settings.inventory)
                    if extension
                    else self._settings.inventory
                )
            return self._settings

    @property
    def settings(self) -> PolicySettings:
        settings = self._settings if self._fixed else self.refresh()
        if settings is None:
            raise SettingsMissingError()
        return settings

    @property
    def inventory(self) -> DeviceInventory:
        """The hub's inventory as its backend knows it (on Slurm: every reported GPU under its real UUID)."""
        settings = self.settings
        return settings.inventory if self._fixed or self._inventory is None else self._inventory

    @property
    def default(self) -> Quota:
        return self.settings.default_quota

    def today(self) -> date:
        """The hub's date: its clock (the test clock where one is set) in its time zone, as the hub's own
        policy reads it, so a course starts and ends at the same moment for both."""
        settings = self.settings
        return hub_clock(settings.test_clock_file)().astimezone(zone(settings.time_zone)).date()

    @property
    def node(self) -> str:
        return self.settings.node

    @property
    def simulated(self) -> bool:
        return self.settings.simulated

    def models(self) -> list[str]:
        return self.settings.models()

    # -- live readings -------------------------------------------------------------------

    def readings(self) -> dict[str, dict]:
        """Live readings by GPU UUID (cached 1 s); empty when they cannot be read."""
        if time.monotonic() - self._reading_at < 1.0 and self._reading is not None:
            return self._reading
        result: dict[str, dict] = {}
        inventory = self.inventory
        try:
            if self._source is None:
                from workbench_devices import make_source, select_devices

                if inventory.source == "simulated":
                    # An empty environment selects the whole fleet (no WORKBENCH_GPUS); only
                    # GPUs with a lease in the ledger show simulated load, free ones read idle.
                    self._source = SimulatedSource(
                        select_devices(inventory, {}),
                        held=self.held_uuids,
                        script=self.settings.simulated_utilization or None,
                    )
                elif inventory.source == "nvml" and inventory.devices:
                    self._source = make_source({})
                else:
                    return {}  # static GPUs: the hub cannot read them
            snapshot = self._source.read()
            for gpu in snapshot.get("gpus", []):
                result[gpu["uuid"]] = {**gpu, "source": snapshot.get("source")}
        except Exception as exc:  # noqa: BLE001 - boundary: never let a monitoring hiccup break the page
            log.warning("Could not read live GPU numbers: %s", exc)
        self._reading, self._reading_at = result, time.monotonic()
        return result

    def dcgm_scrape(self) -> Scrape | None:
        """The dcgm-exporters' series (blocking, at most one scrape every 2 s); None when the hub names none."""
        urls = self.settings.dcgm_exporter_urls
        return self.dcgm.scrape(urls) if urls else None

    def _slice_reading(self, device, reading: dict, scrape: Scrape | None) -> tuple[dict, str | None]:
        """A slice's reading from DCGM where the hub names exporters, and why there is none if none."""
        if scrape is None:
            return reading, None if reading.get("utilization_percent") is not None else NOT_CONFIGURED
        percent, why = scrape.reading(device)
        if percent is None:
            return {**reading, "utilization_percent": None}, why
        return {**reading, "utilization_percent": percent, "source": "dcgm"}, None

    # -- views -----------------------------------------------------------------------------

    def gpus(self) -> list[dict]:
        settings = self.settings
        holders: dict[str, list[dict]] = {}
        for lease in self.store.leases():
            for uuid in lease.gpu_uuids:
                holders.setdefault(uuid, []).append(
                    {
                        "user": lease.user,
                        "server": lease.server,
                        "since": lease.since.isoformat(),
                        "node": lease.node or settings.node,
                    }
                )
        readings = self.readings()
        now = utcnow()
        # Idle clocks by (node, GPU): on a cluster a track names the lease's node, on one host this one.
        idle = {(t.node or settings.node, t.gpu_uuid): t for t in IdleBook(self.store).tracks()}
        # Only the hub's own placement reads drains (api/drains refuses new ones where an engine places).
        drained = DrainBook(self.store).drained() if settings.placement == "host" else set()
        # A GPU whose new layout waits for its servers: its rows say so, and no new server gets them.
        waiting = {uuid: w["message"] for w in self.layout_waiting() for uuid in w.get("devices") or ()}
        scrape = self.dcgm_scrape() if any(d.mig for d in self.inventory.devices) else None
        result = []
        for device in self.inventory.devices:
            reading = readings.get(device.uuid, {})
            held = holders.get(device.uuid, [])
            why = None
            if device.mig:
                reading, why = self._slice_reading(device, reading, scrape)
            track = idle.get((device.node or settings.node, device.uuid)) if held else None
            idle_for = track.idle_for(now) if track else None
            if reading.get("utilization_percent") is None and track is not None and track.utilization is not None:
                # A GPU the service cannot read itself (another node): idle reclaim's last reading of it,
                # from the user server's own monitor.
                reading = {**reading, "utilization_percent": track.utilization, "source": track.source}
                why = None
            closed = is_drained(device, drained)
            result.append(
                {
                    "index": device.index,
                    "uuid": device.uuid,
                    "name": device.name,
                    "model": device.model,
                    "node": device.node or settings.node,
                    "memory_total_bytes": device.memory_total_bytes,
                    # A MIG slice: its profile and its GPU (index and model above are the GPU's).
                    "mig": device.mig,
                    "profile": device.profile or None,
                    "parent_uuid": device.parent_uuid or None,
                    "share": round(device.share, 4),
                    "simulated": settings.simulated,
                    "holders": held,
                    # Servers this device takes at once (more than 1: time-sliced) and how many more fit.
                    "slots": settings.slots_for(device),
                    "free_slots": 0
                    if closed or device.uuid in waiting
                    else max(0, settings.slots_for(device) - len(held)),
                    # Drained (api/drains): no new server gets it; its holders keep running until they stop.
                    "drained": closed,
                    # Why the engine gives it to no new server now (the backend's annotation: a Slurm node
                    # down or drained); it then has no free slot. None: usable.
                    "unavailable": None,
                    # "layout change waiting: 3 servers still on slices the new layout removes"; None otherwise.
                    "layout_waiting": waiting.get(device.uuid),
                    "utilization_percent": reading.get("utilization_percent"),
                    "memory_used_bytes": reading.get("memory_used_bytes"),
                    "temperature_c": reading.get("temperature_c"),
                    "power_w": reading.get("power_w"),
                    "reading_source": reading.get("source"),
                    # A held slice without a reading (so without an idle rule): why ("no exporter configured"...).
                    "no_reading_reason": why if held and reading.get("utilization_percent") is None else None,
                    "gpu_instance_id": device.gpu_instance_id,
                    # Idle reclaim's clock for a held GPU (None: busy, or no reading yet).
                    "idle_seconds": None if idle_for is None else round(idle_for.total_seconds(), 1),
                }
            )
        extension = extension_of(settings.backend)
        if extension is not None:
            extension.annotate_fleet(result)
        return result

    def layout_waiting(self) -> list[dict]:
        """The GPUs whose re-read layout waits for servers on devices it removes, as the hub published them
        (``LayoutWait.to_json``); empty where an engine places (the hub re-reads nothing there)."""
        if self.settings.placement != "host":
            return []
        return load_layout_waiting(self.store)

    def allocations(self) -> list[dict]:
        node = self.settings.node
        return [
            {
                "user": lease.user,
                "server": lease.server,
                "node": lease.node or node,
                "gpu_uuids": list(lease.gpu_uuids),
                "since": lease.since.isoformat(),
                "ref": lease.ref,
            }
            for lease in self.store.leases()
        ]

    def held_uuids(self) -> set[str]:
        """The GPUs that some server holds now, from the ledger."""
        return {uuid for lease in self.store.leases() for uuid in lease.gpu_uuids}

    def held_by_user(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for lease in self.store.leases():
            held[lease.user] = held.get(lease.user, 0) + len(lease.gpu_uuids)
        return held

    def held_by_server(self) -> dict[str, dict[str, int]]:
        """User -> server -> devices it holds now (JupyterHub's server name; "" the default server)."""
        held: dict[str, dict[str, int]] = {}
        for lease in self.store.leases():
            servers = held.setdefault(lease.user, {})
            servers[lease.server] = servers.get(lease.server, 0) + len(lease.gpu_uuids)
        return held

    def user_summaries(
        self,
        users: Iterable[Mapping],
        hours: Mapping[str, float],
        held: Mapping[str, int],
        by_reason: Mapping[str, Mapping[str, float]] | None = None,
        servers: Mapping[str, Mapping[str, dict]] | None = None,
    ) -> list[dict]:
        """One row per hub user model (name, groups): effective quota, held GPUs, GPU-hours, and with
        ``by_reason`` (``gpu_hours_by_reason``) those GPU-hours by why their leases ended, so an admin
        tells time ended by the user's Stop from time lost to crashes, reclaims or failed nodes; with
        ``servers`` (``server_usage``) the same per server of the user, named servers and the default one.

        The quotas of all of them come from one query (``QuotaBook.effective_many``).
        """
        users = list(users)
        effective = self.book.effective_many({u["name"]: u.get("groups") or [] for u in users}, self.default)
        rows = []
        for u in users:
            row = {
                "name": u["name"],
                "groups": list(u.get("groups") or []),
                "quota": effective[u["name"]].to_json(),
                "held_gpus": held.get(u["name"], 0),
                "gpu_hours_week": round(hours.get(u["name"], 0.0), 4),
            }
            if by_reason is not None:
                kinds = by_reason.get(u["name"]) or {}
                row["gpu_hours_week_by_reason"] = {kind: round(kinds[kind], 4) for kind in sorted(kinds)}
            if servers is not None:
                row["servers"] = dict(servers.get(u["name"]) or {})
            rows.append(row)
        return rows


def server_usage(
    split: Mapping[str, Mapping[tuple[str, str], float]], held: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, dict]]:
    """User -> server -> ``{"gpu_hours_week", "held_gpus"}`` for every server of a user that held GPUs in the
    window or holds some now (``split``: ``gpu_hours_split``; ``held``: ``Fleet.held_by_server``), sorted by
    name, the default server ("") first: api/usage's split of a user's GPU-hours by server."""
    result: dict[str, dict[str, dict]] = {}
    for user in split.keys() | held.keys():
        hours: dict[str, float] = {}
        for (server, _kind), value in (split.get(user) or {}).items():
            hours[server] = hours.get(server, 0.0) + value
        names = sorted(hours.keys() | (held.get(user) or {}).keys())
        result[user] = {
            name: {"gpu_hours_week": round(hours.get(name, 0.0), 4), "held_gpus": (held.get(user) or {}).get(name, 0)}
            for name in names
        }
    return result
