"""Admission: every refusal the product makes, with its words and HTTP status.

``admit`` is a pure function, so the whole rule book is one table: the
context (quota, what the user holds, GPU-hours used, the inventory), the
options asked for, and the exact refusal or the admitted request.
"""

from __future__ import annotations

import pytest

from workbench_spawner.rules.admission import AdmissionContext, Admitted, Refusal, admit
from workbench_spawner.rules.quota import EffectiveQuota, Quota, ServerHolding

MODELS = ("A100-40GB", "H100-80GB")
ASK = "ask the course staff to raise your GPU quota"


ONE_GPU = Quota(1)


def ctx(quota: Quota = ONE_GPU, source: str = "default", group: str | None = None, **kw) -> AdmissionContext:
    base = dict(
        quota=EffectiveQuota(quota, source, group),
        inventory_size=4,
        inventory_models=MODELS,
        free_by_model={"A100-40GB": 2, "H100-80GB": 1},
        contact="the course staff",
        offered_images=("img:12.6", "img:12.8"),
        profiles=("small", "large"),
    )
    return AdmissionContext(**(base | kw))


REFUSALS = [
    # (context, options, status, reason, exact message)
    (ctx(), {"gpus": -1}, 400, "bad_options", "Cannot start the server: gpus cannot be negative (asked for -1)."),
    (
        ctx(),
        {"gpus": "two"},
        400,
        "bad_options",
        "Cannot start the server: gpus must be a whole number such as 0, 1 or 2, not 'two'.",
    ),
    (
        ctx(),
        {"gpus": 1.5},
        400,
        "bad_options",
        "Cannot start the server: gpus must be a whole number of GPUs, not 1.5.",
    ),
    (
        ctx(),
        {"gpus": True},
        400,
        "bad_options",
        "Cannot start the server: gpus must be a whole number such as 0, 1 or 2, not true/false.",
    ),
    (ctx(), {"gpus": 9}, 400, "bad_options", "Cannot start the server: asked for 9 GPUs but this hub has only 4."),
    (
        ctx(inventory_size=0, inventory_models=()),
        {"gpus": 1},
        400,
        "bad_options",
        "Cannot start the server: this hub has no GPUs, so it can only start CPU servers (gpus=0), not gpus=1.",
    ),
    (
        ctx(),
        {"gpus": 1, "colour": "red"},
        400,
        "bad_options",
        "Cannot start the server: unknown spawn option(s): 'colour'; accepted options are gpus, gpu_model, "
        "gpu_profile, image, profile.",
    ),
    (
        ctx(),
        {"gpus": 1, "gpu_model": "V100"},
        400,
        "bad_options",
        "Cannot start the server: unknown gpu_model 'V100'; this hub has: A100-40GB, H100-80GB.",
    ),
    (
        ctx(),
        {"gpus": 1, "image": "evil:latest"},
        400,
        "bad_options",
        "Cannot start the server: image 'evil:latest' is not offered here; choose one of: img:12.6, img:12.8.",
    ),
    (
        ctx(offered_images=()),
        {"gpus": 1, "image": "img:12.6"},
        400,
        "bad_options",
        "Cannot start the server: this hub does not offer a choice of images.",
    ),
    (
        ctx(),
        {"gpus": 1, "profile": "huge"},
        400,
        "bad_options",
        "Cannot start the server: profile 'huge' is not offered here; choose one of: small, large.",
    ),
    (
        ctx(cpu_servers_allowed=False),
        {"gpus": 0},
        403,
        "quota",
        "Cannot start the server: CPU-only servers are switched off on this hub; ask for at least one GPU.",
    ),
    (
        ctx(Quota(2, gpu_hours_per_week=10), "user", gpu_hours_used=10.04),
        {"gpus": 1},
        403,
        "quota",
        "Cannot start the server: your own GPU quota allows 10 GPU-hours per week and you used 10.0 in the last "
        f"7 days. Start a CPU-only server (0 GPUs), wait until older use leaves the 7-day window, or {ASK}.",
    ),
    (
        ctx(Quota(0), "user"),
        {"gpus": 1},
        403,
        "quota",
        f"Cannot start the server: you asked for 1 GPU, but your own GPU quota allows 0 at once. "
        f"Ask for fewer, or {ASK}.",
    ),
    (
        ctx(Quota(2), "group", "ml-course", others=(ServerHolding("r1", 1, ("H100-80GB",)),)),
        {"gpus": 2},
        403,
        "quota",
        "Cannot start the server: you asked for 2 GPUs, but the GPU quota of group ml-course allows 2 at once "
        f"and your other server r1 holds 1 (H100-80GB). Stop r1 first, ask for fewer, or {ASK}.",
    ),
    (
        ctx(Quota(1), others=(ServerHolding("", 1, ("A100-40GB",)),)),
        {"gpus": 1},
        403,
        "quota",
        "Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and your default "
        f"server holds 1 (A100-40GB). Stop your default server first, ask for fewer, or {ASK}.",
    ),
    (
        ctx(Quota(3), "user", others=(ServerHolding("big", 2, ("H100-80GB",)), ServerHolding("", 1))),
        {"gpus": 1},
        403,
        "quota",
        "Cannot start the server: you asked for 1 GPU, but your own GPU quota allows 3 at once and your other "
        "servers hold 3 (big: 2 H100-80GB; your default server: 1). Stop big or your default server first, "
        f"ask for fewer, or {ASK}.",
    ),
    (
        ctx(Quota(2), "user", others=(ServerHolding("big", 1), ServerHolding("small", 1))),
        {"gpus": 2},
        403,
        "quota",
        "Cannot start the server: you asked for 2 GPUs, but your own GPU quota allows 2 at once and your other "
        f"servers hold 2 (big: 1; small: 1). Stop big and small first, ask for fewer, or {ASK}.",
    ),
    (
        ctx(Quota(1, allowed_models=("A100-40GB",)), "user"),
        {"gpus": 1, "gpu_model": "H100-80GB"},
        403,
        "quota",
        "Cannot start the server: your own GPU quota allows only these GPU models: A100-40GB, not H100-80GB. "
        f"Pick one of those, or {ASK}.",
    ),
    (
        ctx(Quota(1, allowed_models=()), "user"),
        {"gpus": 1},
        403,
        "quota",
        "Cannot start the server: your own GPU quota allows only GPU models this hub does not have (none). "
        f"Start a CPU-only server (0 GPUs), or {ASK}.",
    ),
    (
        ctx(Quota(1, allowed_models=("V100-16GB",)), "user"),
        {"gpus": 1},
        403,
        "quota",
        "Cannot start the server: your own GPU quota allows only GPU models this hub does not have (V100-16GB). "
        f"Start a CPU-only server (0 GPUs), or {ASK}.",
    ),
]


@pytest.mark.parametrize(("context", "options", "status", "reason", "message"), REFUSALS)
def test_every_refusal_keeps_its_words_and_status(context, options, status, reason, message):
    assert admit(options, context) == Refusal(message, status, reason)


ADMITTED = [
    # (context, options, gpus, model)
    (ctx(), {}, 1, None),  # the default count
    (ctx(Quota(0)), {}, 0, None),  # the default is lowered to what the quota allows
    (ctx(Quota(2, gpu_hours_per_week=1), gpu_hours_used=5), {}, 0, None),  # budget spent: CPU by default
    (ctx(Quota(2, gpu_hours_per_week=1), gpu_hours_used=5), {"gpus": 0}, 0, None),  # CPU stays allowed
    (ctx(Quota(4)), {"gpus": "3"}, 3, None),  # form fields arrive as text
    (ctx(), {"gpus": 1, "gpu_model": "h100-80gb"}, 1, "H100-80GB"),  # models match without case
    (ctx(), {"gpus": 0, "gpu_model": "H100-80GB"}, 0, None),  # a model means nothing without GPUs
    # an allowed-models quota without a model asked: the allowed model with the most free GPUs
    (ctx(Quota(1, allowed_models=("H100-80GB",))), {"gpus": 1}, 1, "H100-80GB"),
    (ctx(Quota(1, allowed_models=("A100-40GB", "H100-80GB"))), {"gpus": 1}, 1, None),
]


@pytest.mark.parametrize(("context", "options", "gpus", "model"), ADMITTED)
def test_admitted_requests(context, options, gpus, model):
    verdict = admit(options, context)
    assert isinstance(verdict, Admitted), verdict
    assert (verdict.request.gpus, verdict.request.gpu_model) == (gpus, model)


def test_the_session_limit_in_force_rides_along():
    verdict = admit({"gpus": 1}, ctx(Quota(1, max_session_hours=2.5)))
    assert verdict == Admitted(verdict.request, 2.5)


def test_the_model_with_most_free_gpus_is_chosen_among_the_allowed():
    quota = Quota(1, allowed_models=("A100-40GB", "H100-80GB", "L40S-48GB"))
    context = ctx(
        quota,
        inventory_models=("A100-40GB", "H100-80GB", "L40S-48GB", "T4-16GB"),
        free_by_model={"A100-40GB": 0, "H100-80GB": 3, "L40S-48GB": 1},
    )
    assert admit({"gpus": 1}, context).request.gpu_model == "H100-80GB"


@pytest.mark.parametrize(
    ("held", "used", "budget", "expected"),
    [(0, 0, None, 2), (1, 0, None, 1), (3, 0, None, 0), (0, 9.9, 10, 2), (0, 10, 10, 0)],
)
def test_allowed_now(held, used, budget, expected):
    others = (ServerHolding("r1", held),) if held else ()
    context = ctx(Quota(2, gpu_hours_per_week=budget), others=others, gpu_hours_used=used)
    assert context.held_elsewhere == held
    assert context.allowed_now() == expected
