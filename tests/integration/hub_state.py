"""Everything a forged or unauthorized request could change on a hub with the workbench service, read
in one snapshot, and the words for what changed between two.

The security tests (tests/integration/test_authorization_table.py, test_no_state_change_on_get.py)
take a snapshot before a request that must change nothing and compare it with one after. A snapshot
holds the hub's side (its users: admin flag, groups, servers and whether each is ready or pending;
its groups; NativeAuthenticator's sign-ups in ``users_info``: authorized or not, and a digest of the
password hash, so a changed password shows) and the workbench service's (quotas, reservations,
drains, idle exemptions, and the GPU leases its database holds). It is read with the hub's
automation token (``WORKBENCH_ADMIN_TOKEN``), which sees all of it; ``users_info`` is read straight
from the hub's SQLite file, as NativeAuthenticator has no API.

Fields that move by themselves (last activity, idle seconds, the time an answer was made) are left
out, so two snapshots of a hub nobody touched are equal.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from typing import Any

from tests.service.conftest import WorkbenchHub


def sign_ups(hub: WorkbenchHub) -> dict[str, dict[str, Any]]:
    """NativeAuthenticator's sign-ups: name -> authorized, and a short digest of the password hash."""
    with sqlite3.connect(hub.data_dir / "jupyterhub.sqlite") as db:
        rows = db.execute("SELECT username, is_authorized, password FROM users_info ORDER BY username").fetchall()
    return {
        name: {"authorized": bool(authorized), "password": hashlib.sha256(bytes(password or b"")).hexdigest()[:12]}
        for name, authorized, password in rows
    }


def _service_json(hub: WorkbenchHub, path: str) -> Any:
    r = hub.service("GET", path, validate=False)
    assert r.status_code == 200, f"reading the service's state: GET {path} answered {r.status_code}: {r.text[:300]}"
    return r.json()


def snapshot(hub: WorkbenchHub) -> dict[str, Any]:
    """The hub's and the service's state now (see the module's docstring for what is in it)."""
    users = hub.api("GET", "/users").json()
    groups = hub.api("GET", "/groups").json()
    quotas = _service_json(hub, "api/quotas")
    return {
        "hub users": {
            user["name"]: {
                "admin": user["admin"],
                "groups": sorted(user.get("groups") or []),
                "servers": {
                    name: {"ready": server.get("ready"), "pending": server.get("pending")}
                    for name, server in sorted((user.get("servers") or {}).items())
                },
            }
            for user in users
        },
        "hub groups": {group["name"]: sorted(group.get("users") or []) for group in groups},
        "sign-ups": sign_ups(hub),
        "user quotas": {q["name"]: q for q in quotas["users"]},
        "group quotas": {q["name"]: q for q in quotas["groups"]},
        "reservations": {r["id"]: r for r in _service_json(hub, "api/reservations")["reservations"]},
        "drains": {d["gpu_uuid"]: d for d in _service_json(hub, "api/drains")["drains"]},
        "idle exemptions": {e["group"]: e for e in _service_json(hub, "api/idle/exemptions")["exempt_groups"]},
        "GPU leases": hub.leases(),
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two snapshots, one line per changed entry ("sign-ups: eve: ... -> ...")."""
    lines = []
    for part in before.keys() | after.keys():
        old, new = before.get(part, {}), after.get(part, {})
        for key in sorted(old.keys() | new.keys()):
            if old.get(key) != new.get(key):
                lines.append(f"{part}: {key}: {_short(old.get(key))} -> {_short(new.get(key))}")
    return sorted(lines)


def _short(value: Any) -> str:
    text = "(none)" if value is None else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:300] + "..."
