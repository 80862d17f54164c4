"""The spawn form: what a user may ask for now, rendered from one snapshot.

The form shows the same numbers admission will check (``AdmissionContext``)
and the GPUs' state, both read in a worker thread by the caller
(``spawn_page.py``), so rendering is a pure function of data and never
touches the database. Where a student may have several servers it says
which one it starts and which holds each of their GPUs (``servers.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from workbench_spawner.form.servers import gpu_state, held_sentence, names_servers, starting_sentence
from workbench_spawner.policy.gpu_policy import GPUStatus
from workbench_spawner.rules.admission import AdmissionContext
from workbench_spawner.rules.profiles import ResourceProfile, default_profile

_jinja = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=select_autoescape(["html"])
)


def render_options_form(
    *,
    user: str,
    ctx: AdmissionContext,
    status: Sequence[GPUStatus],
    source: str,
    message: str,
    shared: bool,
    profiles: Sequence[ResourceProfile],
    limits_enforced: bool,
    held: Mapping[str, int],
    reserved: Sequence[str] = (),
    server: str = "",
    named_servers: bool = False,
) -> str:
    """The form for ``user``'s server ``server`` ("" the default one). ``held``: the devices each of the user's
    servers holds now (``servers.held_by_server``); ``named_servers``: whether the hub lets users have several
    servers, so the form says which one it starts."""
    quota = ctx.quota.quota
    allowed = ctx.allowed_now()
    naming = names_servers(server, held)
    return _jinja.get_template("options_form.html").render(
        gpus=[(s, gpu_state(s, user, naming)) for s in status],
        source=source,
        message=message,
        allowed=allowed,
        quota=quota.max_gpus,
        quota_source=ctx.quota.describe,
        default=min(ctx.default_gpus, allowed),
        free=sum(1 for s in status if s.free_slots > 0),
        free_text=free_text(status),
        shared=shared,
        models=ctx.offered_models(),
        images=list(ctx.offered_images),
        profiles=list(profiles),
        default_profile=default_profile(list(profiles)),
        limits_enforced=limits_enforced,
        starting=starting_sentence(server) if named_servers or server else "",
        held_text=held_sentence(held, naming),
        hours_used=ctx.gpu_hours_used,
        hours_budget=quota.gpu_hours_per_week,
        allowed_models=quota.allowed_models,
        max_session_hours=quota.max_session_hours,
        shared_gpus_allowed=quota.shared_gpus,
        cpu_allowed=ctx.cpu_servers_allowed,
        contact=ctx.contact,
        reserved=list(reserved),
        kinds=gpu_kinds(ctx),
    )


def free_text(status: Sequence[GPUStatus]) -> str:
    """ "3 of 4 GPUs free now", or "1 of 1 GPU and 5 of 7 MIG slices free now": slices are not GPUs.

    Devices the engine would give no new server (``GPUStatus.unavailable``: their node is down or
    drained) are neither free nor counted among the GPUs one may get: "2 of 2 GPUs free now; 2 more
    unavailable (node wbnode1 is down)"."""

    def counted(rows: list[GPUStatus], noun: str) -> str:
        free = sum(1 for s in rows if s.free_slots > 0)
        usable = sum(1 for s in rows if not s.unavailable)
        return f"{free} of {usable} {noun}{'' if usable == 1 else 's'}"

    away = [s for s in status if s.unavailable]
    whys = "; ".join(dict.fromkeys(s.unavailable for s in away))
    if away and len(away) == len(status):
        return f"No GPU free now: all {len(away)} unavailable ({whys})"
    whole = [s for s in status if not s.device.mig]
    slices = [s for s in status if s.device.mig]
    # A kind whose every device is unavailable (wbnode2's slices while it is down) is said once, below.
    show_whole = any(not s.unavailable for s in whole) or not slices
    parts = [counted(whole, "GPU")] if show_whole else []
    if any(not s.unavailable for s in slices):
        parts.append(counted(slices, "MIG slice"))
    text = " and ".join(parts) + " free now"
    return text + (f"; {len(away)} more unavailable ({whys})" if away else "")


def gpu_kinds(ctx: AdmissionContext) -> list[dict[str, str]]:
    """The spawn form's choice of kind where the hub has MIG slices: whole GPUs and each profile the quota
    allows, with how many are free ("1 x 1g.18gb slice of an H200-141GB, 18 GB: 5 of 7 free"); the
    choice is sent as ``gpu_profile``, as the REST API takes it (empty: whole GPUs).

    Empty where the hub has no slices (or cannot hand them out): the form then asks for GPUs as before."""
    if not ctx.slices or not ctx.pins_slices:
        return []
    quota = ctx.quota.quota
    kinds = []
    if ctx.inventory_size and quota.allows_profile(""):
        free = sum(ctx.free_by_model.get(m, 0) for m in ctx.inventory_models)
        kinds.append({"value": "", "label": f"Whole GPUs: {free} of {ctx.inventory_size} free"})
    for profile, by_model in ctx.slices.items():
        models = [m for m in by_model if quota.allows_model(m)]
        if not quota.allows_profile(profile) or not models:
            continue
        free = sum(ctx.free_by_model.get(f"{m} {profile}", 0) for m in models)
        total = sum(by_model[m] for m in models)
        memory = profile.split(".")[1].upper().replace("GB", " GB")
        of = " or ".join(f"an {m}" for m in models)
        kinds.append({"value": profile, "label": f"1 \u00d7 {profile} slice of {of}, {memory}: {free} of {total} free"})
    return kinds
