"""Admission by kind: whole GPUs or MIG slices, which profiles a quota allows, and the backend's reach."""

from __future__ import annotations

import pytest

from workbench_spawner.rules.admission import AdmissionContext, Admitted, Refusal, admit
from workbench_spawner.rules.quota import EffectiveQuota, Quota

SLICES = {"1g.18gb": {"H200-141GB": 7}, "3g.40gb": {"H100-80GB": 2, "A100-80GB": 2}}
STUDENT = Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",))
ASK = "ask the course staff to raise your GPU quota"
ONE_SLICE = (
    "Cannot start the server: a server gets one MIG slice at most, not {n} slices{of}: a CUDA program sees only "
    "one MIG slice, so the others could not be used. Ask for {instead}."
)


TWO_GPUS = Quota(2)


def ctx(quota: Quota = TWO_GPUS, group: str | None = None, **kw) -> AdmissionContext:
    base = dict(
        quota=EffectiveQuota(quota, "group" if group else "default", group),
        inventory_size=2,
        inventory_models=("H100-80GB",),
        slices=SLICES,
        free_by_model={"H100-80GB": 1, "H200-141GB 1g.18gb": 5, "H100-80GB 3g.40gb": 0, "A100-80GB 3g.40gb": 2},
        contact="the course staff",
    )
    return AdmissionContext(**(base | kw))


ADMITTED = [
    # (context, options, gpus, gpu_profile, gpu_model)
    (ctx(), {"gpus": 1, "gpu_profile": "1g.18gb"}, 1, "1g.18gb", None),
    (ctx(), {"gpus": 1}, 1, None, None),  # whole GPUs as before
    (ctx(STUDENT, "students"), {}, 1, "1g.18gb", None),  # the quota's only kind, chosen for them
    (ctx(STUDENT, "students"), {"gpus": 1, "gpu_profile": "1G.18GB"}, 1, "1g.18gb", None),
    # A hub of slices only: the profile with the most free slices now.
    (ctx(inventory_size=0, inventory_models=()), {"gpus": 1}, 1, "1g.18gb", None),
    # A quota that narrows models narrows the slices' models: A100-80GB has the free 3g.40gb slices.
    (ctx(Quota(2, allowed_models=("A100-80GB", "H100-80GB"))), {"gpu_profile": "3g.40gb"}, 1, "3g.40gb", None),
    (ctx(Quota(2, allowed_models=("A100-80GB",))), {"gpu_profile": "3g.40gb"}, 1, "3g.40gb", "A100-80GB"),
    (ctx(Quota(2, allowed_profiles=())), {"gpus": 2}, 2, None, None),  # research: whole GPUs only
    (ctx(STUDENT), {"gpus": 0}, 0, None, None),  # CPU only stays possible
    # A hub's default of two GPUs gives a slice request one slice (one a server), not a refusal.
    (ctx(Quota(4), default_gpus=2), {"gpu_profile": "1g.18gb"}, 1, "1g.18gb", None),
    (ctx(Quota(4, whole_gpus=False), default_gpus=2), {}, 1, "1g.18gb", None),
    (ctx(Quota(4), default_gpus=2), {}, 2, None, None),  # whole GPUs keep the default
]


@pytest.mark.parametrize(("context", "options", "gpus", "profile", "model"), ADMITTED)
def test_admitted_by_kind(context, options, gpus, profile, model):
    verdict = admit(options, context)
    assert isinstance(verdict, Admitted), verdict
    assert (verdict.request.gpus, verdict.request.gpu_profile, verdict.request.gpu_model) == (gpus, profile, model)


REFUSALS = [
    # (context, options, status, exact message)
    (
        ctx(STUDENT, "students"),
        {"gpus": 1, "gpu_profile": "3g.40gb"},
        403,
        f"Cannot start the server: the GPU quota of group students allows only MIG slices of 1g.18gb, not 3g.40gb. "
        f"Ask for one of those, or {ASK}.",
    ),
    (
        ctx(Quota(2, allowed_profiles=())),
        {"gpu_profile": "1g.18gb"},
        403,
        f"Cannot start the server: the default quota allows no MIG slices, not 1g.18gb. Ask for whole GPUs, or {ASK}.",
    ),
    (
        ctx(Quota(1, whole_gpus=False, allowed_profiles=("2g.35gb",)), "students"),
        {"gpus": 1},
        403,
        "Cannot start the server: the GPU quota of group students allows no whole GPUs, and no MIG slice it has "
        f"may be yours (its slices: 1g.18gb, 3g.40gb). Start a CPU-only server (0 GPUs), or {ASK}.",
    ),
    (
        ctx(STUDENT, "students"),
        {"gpus": 1, "gpu_model": "H100-80GB"},
        403,
        "Cannot start the server: the GPU quota of group students allows no whole GPUs (only MIG slices of "
        f"1g.18gb), so not a whole H100-80GB. Ask for a slice, or {ASK}.",
    ),
    (
        ctx(Quota(1, allowed_profiles=()), inventory_size=0, inventory_models=()),
        {"gpus": 1},
        403,
        "Cannot start the server: this hub has no whole GPUs, and no MIG slice it has may be yours "
        f"(its slices: 1g.18gb, 3g.40gb). Start a CPU-only server (0 GPUs), or {ASK}.",
    ),
    (
        ctx(Quota(2, allowed_models=("H100-80GB",))),
        {"gpu_profile": "1g.18gb"},
        403,
        "Cannot start the server: the default quota allows only these GPU models: H100-80GB, and this hub has 1g.18gb "
        f"slices only on H200-141GB. Ask for another slice, or {ASK}.",
    ),
    # One slice a server (a CUDA program sees one MIG device): the refusal names only what the quota allows.
    (
        ctx(Quota(8)),
        {"gpus": 3, "gpu_profile": "3g.40gb", "gpu_model": "H100-80GB"},
        400,
        ONE_SLICE.format(n=3, of=" of 3g.40gb", instead="one slice or whole GPUs"),
    ),
    (
        ctx(Quota(8)),
        {"gpus": 2, "gpu_profile": "1g.18gb"},
        400,
        ONE_SLICE.format(n=2, of=" of 1g.18gb", instead="one slice, one of a larger profile (3g.40gb) or whole GPUs"),
    ),
    (
        ctx(Quota(8, allowed_profiles=("1g.18gb",), whole_gpus=False)),
        {"gpus": 2, "gpu_profile": "1g.18gb"},
        400,
        ONE_SLICE.format(n=2, of=" of 1g.18gb", instead="one slice"),
    ),
    (
        # A quota of slices only on a hub that has whole GPUs too: admission would pick a slice, still one.
        ctx(Quota(2, whole_gpus=False)),
        {"gpus": 2},
        400,
        ONE_SLICE.format(n=2, of="", instead="one slice (1g.18gb, 3g.40gb)"),
    ),
    # Several of what the quota refuses anyway: that refusal speaks, not the one-slice rule's offer.
    (
        ctx(Quota(2, allowed_profiles=())),
        {"gpus": 2, "gpu_profile": "1g.18gb"},
        403,
        f"Cannot start the server: the default quota allows no MIG slices, not 1g.18gb. Ask for whole GPUs, or {ASK}.",
    ),
    (
        ctx(Quota(2, whole_gpus=False)),
        {"gpus": 2, "gpu_model": "H100-80GB"},
        403,
        "Cannot start the server: the default quota allows no whole GPUs (only MIG slices of 1g.18gb, 3g.40gb), "
        f"so not a whole H100-80GB. Ask for a slice, or {ASK}.",
    ),
    (
        ctx(Quota(2, allowed_models=("H100-80GB",))),
        {"gpus": 2, "gpu_profile": "1g.18gb"},
        403,
        "Cannot start the server: the default quota allows only these GPU models: H100-80GB, and this hub has "
        f"1g.18gb slices only on H200-141GB. Ask for another slice, or {ASK}.",
    ),
    (
        # A hub of slices only: one slice a server, whichever profile admission would pick.
        ctx(Quota(4), inventory_size=0, inventory_models=()),
        {"gpus": 2},
        400,
        ONE_SLICE.format(n=2, of="", instead="one slice (1g.18gb, 3g.40gb)"),
    ),
    (
        ctx(),
        {"gpu_profile": "2g.35gb"},
        400,
        "Cannot start the server: this hub has no MIG slices of '2g.35gb'; it has: 1g.18gb (7 on H200-141GB), "
        "3g.40gb (2 on H100-80GB, 2 on A100-80GB).",
    ),
    (
        ctx(pins_slices=False),
        {"gpu_profile": "1g.18gb"},
        400,
        "Cannot start the server: this hub's backend hands out whole GPUs only, not MIG slices; "
        "ask for whole GPUs (gpus, and gpu_model if you need one).",
    ),
    (
        ctx(STUDENT, "students"),
        {"gpus": 2},
        400,
        ONE_SLICE.format(n=2, of="", instead="one slice (1g.18gb)"),
    ),
]


@pytest.mark.parametrize(("context", "options", "status", "message"), REFUSALS)
def test_refused_by_kind_with_a_sentence(context, options, status, message):
    verdict = admit(options, context)
    assert isinstance(verdict, Refusal), verdict
    assert (verdict.status, verdict.message) == (status, message)


@pytest.mark.parametrize(
    ("profile", "than", "larger"),
    [
        ("2g.35gb", "1g.18gb", True),
        ("1g.35gb", "1g.18gb", True),  # the same compute, more memory
        ("2g.10gb", "1g.20gb", False),  # more compute, less memory: not simply larger
        ("1g.18gb", "1g.18gb", False),
        ("1g.10gb.me", "1g.10gb", False),  # an engine's resource name that is no profile: never offered
        ("3g.40gb", "", False),
    ],
)
def test_a_larger_profile_has_at_least_the_compute_and_memory(profile, than, larger):
    from workbench_spawner.rules.admission import _larger

    assert _larger(profile, than) is larger
