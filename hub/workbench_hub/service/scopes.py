"""Who may read whose data on the workbench service: its three custom scopes, and the sentences of a refusal.

The hub registers the scopes (``configurer.update_services``) and the
service decides with them on every request, from the scopes the caller's
token holds (HubAuth's user model, ``scopes``):

* ``custom:workbench:admin``: read and change everything;
* ``custom:workbench:read``: read everyone's data (the fleet, every quota,
  every user's usage, the metrics);
* ``custom:workbench:self``: a hub user's own data only: their quota, their
  GPU-hours, their servers and past stops (``api/me``, the My GPUs page,
  ``api/usage`` and ``api/quotas/users/{name}`` for themselves). The hub's
  default ``user`` role grants it to every user, so a student's token and
  their browser login hold it, and a token narrowed to something else
  (``read:users:name``, say) does not: it is refused with a sentence naming
  the scope.

A role may grant the self scope filtered, as JupyterHub filters its own
scopes (``custom:workbench:self!user=alice``, ``...!group=ml-course``); it
then counts only for that user or the members of that group. The read and
admin scopes count only unfiltered: they are about everyone's data.

The OpenAPI document says the same per operation (``x-scope``,
``x-self-scope``, ``x-self-param``), and the authorization-table test calls
every operation as each kind of caller against it.
"""

from __future__ import annotations

from collections.abc import Mapping

ADMIN_SCOPE = "custom:workbench:admin"
READ_SCOPE = "custom:workbench:read"
SELF_SCOPE = "custom:workbench:self"

SCOPE_DESCRIPTIONS = {
    ADMIN_SCOPE: "Read and change GPU quotas; see every GPU, lease and user's usage",
    READ_SCOPE: "See every GPU, lease, quota and user's usage on the workbench service",
    SELF_SCOPE: "See your own GPU quota, GPU-hours, servers and past stops on the workbench service",
}


def scopes_of(caller: Mapping | None) -> set[str]:
    return set((caller or {}).get("scopes") or [])


def reads_everyone(caller: Mapping | None) -> bool:
    """The caller may read everyone's data (the read or the admin scope)."""
    return bool({ADMIN_SCOPE, READ_SCOPE} & scopes_of(caller))


def is_admin(caller: Mapping | None) -> bool:
    return ADMIN_SCOPE in scopes_of(caller)


def holds_self_scope(caller: Mapping | None) -> bool:
    """A hub user whose token holds ``custom:workbench:self`` for themselves: unfiltered, or filtered to their
    own name or to a group they are in. A service has no data of its own to read."""
    if not caller or caller.get("kind", "user") != "user":
        return False
    name = caller.get("name") or ""
    groups = set(caller.get("groups") or [])
    for scope in scopes_of(caller):
        base, _, where = scope.partition("!")
        if base != SELF_SCOPE:
            continue
        if not where:
            return True
        kind, _, value = where.partition("=")
        if (kind == "user" and value == name) or (kind == "group" and value in groups):
            return True
    return False


def reads_own(caller: Mapping | None) -> bool:
    """A hub user who may read their own data: the self scope, or a scope that reads everyone's."""
    if not caller or caller.get("kind", "user") != "user":
        return False
    return reads_everyone(caller) or holds_self_scope(caller)


def own_data_refusal(caller: Mapping | None, what: str) -> str:
    """Why ``caller`` may not do ``what`` ("reading your own GPU usage"), naming the scope it lacks."""
    if caller and caller.get("kind", "user") != "user":
        return (
            f"{what} is for a hub user's own data, and a service has none: read everyone's with the {READ_SCOPE} "
            f"scope (api/usage?user=NAME)"
        )
    return (
        f"{what} needs the {SELF_SCOPE} scope (or {READ_SCOPE}), which this login or token does not hold: use a "
        f"token with the hub's default scopes (the hub's token page makes one), or ask a hub admin"
    )


def everyone_refusal() -> str:
    return f"this needs the {READ_SCOPE} or {ADMIN_SCOPE} scope; ask a hub admin"
