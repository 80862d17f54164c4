"""Admission: may this user start this request now? Pure rules, no I/O.

Admission is apart from placement so that every backend asks the same
question the same way, before anything is started or submitted: on one host
our allocator then places the GPUs, on Slurm the engine does. Everything the
rules need is gathered first (``AdmissionContext``: the effective quota, what
the user holds elsewhere, GPU-hours used, the inventory) by code that may
touch the database in a worker thread; ``admit`` itself is a plain function,
so a table test can list every refusal the product makes with its words and
HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from workbench_spawner.form.options import OptionError, SpawnRequest, parse_options
from workbench_spawner.rules.quota import EffectiveQuota


@dataclass(frozen=True)
class Refusal:
    """A request that may not start; ``message`` is shown to the user as it is."""

    message: str
    status: int = 400
    reason: str = "bad_options"  # "bad_options" | "quota"


@dataclass(frozen=True)
class Admitted:
    """A request that may start, with the GPU model chosen where the quota narrows it."""

    request: SpawnRequest
    # The session length in force now (None: no limit); a later quota change
    # does not touch a server that already started.
    max_session_hours: float | None = None


@dataclass(frozen=True)
class AdmissionContext:
    """What the rules look at, gathered once per spawn."""

    quota: EffectiveQuota
    inventory_size: int
    inventory_models: Sequence[str] = ()
    held_elsewhere: int = 0
    gpu_hours_used: float = 0.0
    free_by_model: Mapping[str, int] = field(default_factory=dict)
    default_gpus: int = 1
    cpu_servers_allowed: bool = True
    contact: str = "a hub admin"
    offered_images: Sequence[str] = ()
    profiles: Sequence[str] = ()

    @property
    def budget_spent(self) -> bool:
        budget = self.quota.quota.gpu_hours_per_week
        return budget is not None and self.gpu_hours_used >= budget

    def allowed_now(self) -> int:
        """GPUs one more server may ask for now (0 when the week's GPU-hours are spent)."""
        if self.budget_spent:
            return 0
        return max(0, min(self.quota.quota.max_gpus - self.held_elsewhere, self.inventory_size))

    def offered_models(self) -> list[str]:
        """Models of this hub the quota lets the user have."""
        return [m for m in self.inventory_models if self.quota.quota.allows_model(m)]


def admit(options: Mapping[str, Any] | None, ctx: AdmissionContext) -> Admitted | Refusal:
    """Check ``options`` (form or REST, already normalised) against the rules."""
    quota = ctx.quota.quota
    source = ctx.quota.describe
    allowed = ctx.allowed_now()
    ask = f"ask {ctx.contact} to raise your GPU quota"
    try:
        request = parse_options(
            options,
            inventory_size=ctx.inventory_size,
            models=ctx.inventory_models,
            default_gpus=min(ctx.default_gpus, allowed),
            allowed_images=ctx.offered_images,
            profiles=ctx.profiles,
        )
    except OptionError as exc:
        return Refusal(f"Cannot start the server: {exc}.", 400, "bad_options")
    if request.gpus == 0 and not ctx.cpu_servers_allowed:
        return Refusal(
            "Cannot start the server: CPU-only servers are switched off on this hub; ask for at least one GPU.",
            403,
            "quota",
        )
    budget = quota.gpu_hours_per_week
    if request.gpus and ctx.budget_spent:
        return Refusal(
            f"Cannot start the server: {source} allows {budget:g} GPU-hours per week and you "
            f"used {ctx.gpu_hours_used:.1f} in the last 7 days. Start a CPU-only server (0 GPUs), wait until "
            f"older use leaves the 7-day window, or {ask}.",
            403,
            "quota",
        )
    if request.gpus > allowed:
        held = quota.max_gpus - allowed if quota.max_gpus > allowed else 0
        return Refusal(
            f"Cannot start the server: you asked for {request.gpus} GPU(s), but {source} allows "
            f"{quota.max_gpus} at once{f' and your other servers hold {held}' if held else ''}. "
            f"Ask for fewer, or {ask}.",
            403,
            "quota",
        )
    models = quota.allowed_models
    if request.gpus and models is not None:
        if request.gpu_model is not None and not quota.allows_model(request.gpu_model):
            return Refusal(
                f"Cannot start the server: {source} allows only these GPU models: "
                f"{', '.join(models) or 'none'}, not {request.gpu_model}. Pick one of those, or {ask}.",
                403,
                "quota",
            )
        if request.gpu_model is None:
            offered = ctx.offered_models()
            if not offered:
                return Refusal(
                    f"Cannot start the server: {source} allows only GPU models this hub does not have "
                    f"({', '.join(models) or 'none'}). Start a CPU-only server (0 GPUs), or {ask}.",
                    403,
                    "quota",
                )
            if len(offered) < len(ctx.inventory_models):
                # Only allowed models may be handed out: the allowed model with
                # the most free GPUs now (placement places by model).
                best = max(offered, key=lambda m: (ctx.free_by_model.get(m, 0), -offered.index(m)))
                request = replace(request, gpu_model=best)
    return Admitted(request, quota.max_session_hours)
