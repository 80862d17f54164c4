"""The spawn form: what a user may ask for now, rendered from one snapshot.

The form shows the same numbers admission will check (``AdmissionContext``)
and the GPUs' state, both read in a worker thread by the caller, so rendering
is a pure function of data and never touches the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

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
    held: int,
    reserved: Sequence[str] = (),
) -> str:
    quota = ctx.quota.quota
    allowed = ctx.allowed_now()
    return _jinja.get_template("options_form.html").render(
        gpus=status,
        source=source,
        message=message,
        allowed=allowed,
        quota=quota.max_gpus,
        quota_source=ctx.quota.describe,
        default=min(ctx.default_gpus, allowed),
        free=sum(1 for s in status if s.free_slots > 0),
        shared=shared,
        models=ctx.offered_models(),
        images=list(ctx.offered_images),
        profiles=list(profiles),
        default_profile=default_profile(list(profiles)),
        limits_enforced=limits_enforced,
        user=user,
        held=held,
        hours_used=ctx.gpu_hours_used,
        hours_budget=quota.gpu_hours_per_week,
        allowed_models=quota.allowed_models,
        max_session_hours=quota.max_session_hours,
        cpu_allowed=ctx.cpu_servers_allowed,
        contact=ctx.contact,
        reserved=list(reserved),
    )
