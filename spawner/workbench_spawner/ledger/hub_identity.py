"""This hub's id: a short random name made once and kept in its GPU database.

Several hubs may share one runtime (a staging and a production hub on one
Docker engine, two courses' hubs on one Slurm cluster). Everything a hub
makes there (Slurm jobs, containers, volumes, networks) carries this id, and
its reconcile after a restart looks only at what carries it, so one hub never
adopts or ends another hub's servers. It lives in the GPU database, not in a
config file, because it must stay the same for as long as that database (the
leases it names) lives, and must differ between two hubs whatever their
configuration says.
"""

from __future__ import annotations

import json
import secrets

from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, utcnow

HUB_ID_KEY = "hub-id"


def hub_id(store: AllocationStore) -> str:
    """This hub's id (8 hex digits), made on first use; blocking: reads the database once per process."""
    cached: str | None = getattr(store, "_workbench_hub_id", None)
    if cached:
        return cached
    with store.reads()() as session:
        row = session.get(SettingsRow, HUB_ID_KEY)
        value: str | None = json.loads(row.value) if row is not None else None
    if value is None:
        with store.writes().begin() as session:
            row = session.get(SettingsRow, HUB_ID_KEY)
            if row is None:
                row = SettingsRow(key=HUB_ID_KEY, value=json.dumps(secrets.token_hex(4)), updated=utcnow())
                session.add(row)
            value = str(json.loads(row.value))
    store._workbench_hub_id = value  # type: ignore[attr-defined]  # the id never changes for a store
    return value
