"""Reading and checking spawn options, the same for the form and the REST API.

The spawn form sends lists of strings; a JSON body sends numbers and
strings. Both end up here, and every refusal is an ``OptionError`` whose
message a student can act on without reading a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench_devices import GPUDevice

KNOWN_OPTIONS = ("gpus", "gpu_model", "gpu_profile", "image", "profile")


class OptionError(ValueError):
    """A spawn option that cannot be honoured; str(err) is shown to the user."""


@dataclass(frozen=True)
class SpawnRequest:
    gpus: int
    gpu_model: str | None = None
    image: str | None = None
    profile: str | None = None  # a resource profile (CPU, memory), not a MIG profile
    gpu_profile: str | None = None  # a MIG profile: the request is for a slice of it (one a server: admission)
    # Set by admission, not by the user: the quota forbids time-sliced GPUs, so placement takes only
    # devices a server holds alone (``Quota.shared_gpus``).
    exclusive: bool = False

    @property
    def kind(self) -> str | None:
        """What placement looks for (``device_matches``): a model, a MIG profile, both, or None (any GPU)."""
        if self.gpu_profile:
            return f"{self.gpu_model} {self.gpu_profile}" if self.gpu_model else self.gpu_profile
        return self.gpu_model


def device_matches(device: GPUDevice, kind: str | None) -> bool:
    """Whether ``device`` (a ``GPUDevice``) is what a request of ``kind`` (``SpawnRequest.kind``) asks for.

    No kind or a model asks for whole GPUs (a slice is never handed out as a GPU);
    a MIG profile, alone or after a model, asks for slices of that profile."""
    if kind is None:
        return not device.mig
    if not device.mig:
        return bool(device.model == kind)
    return kind in (device.profile, device.kind)


def options_from_form(formdata: Mapping[str, list[str]]) -> dict[str, Any]:
    """Form fields arrive as lists of strings; keep the first of each, as typed.

    Conversion and checks happen in ``parse_options`` so a JSON body and the
    form go through one path.
    """
    options: dict[str, Any] = {}
    for key, values in formdata.items():
        if key.startswith("_") or not values:
            continue
        value = values[0].strip() if isinstance(values[0], str) else values[0]
        if value == "":
            continue
        options[key] = value
    return options


def _as_count(value: Any) -> int:
    if isinstance(value, bool):
        raise OptionError("gpus must be a whole number such as 0, 1 or 2, not true/false")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise OptionError(f"gpus must be a whole number of GPUs, not {value:g}")
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        raise OptionError(f"gpus must be a whole number such as 0, 1 or 2, not {text[:40]!r}")
    raise OptionError("gpus must be a whole number such as 0, 1 or 2")


def _one_of(value: Any, offered: Iterable[str], *, name: str, plural: str, fold_case: bool = False) -> str | None:
    """A pick among what this hub offers (an image, a resource profile); None when not asked."""
    if value is None:
        return None
    offered = list(offered)
    if not isinstance(value, str) or not value.strip():
        raise OptionError(f"{name} must be the name of one of the offered {plural}")
    if not offered:
        raise OptionError(f"this hub does not offer a choice of {plural}")
    choice = value.strip().lower() if fold_case else value.strip()
    if choice not in offered:
        raise OptionError(f"{name} {choice[:80]!r} is not offered here; choose one of: {', '.join(offered)}")
    return choice


def parse_options(
    options: Mapping[str, Any] | None,
    *,
    inventory_size: int,
    models: Iterable[str],
    default_gpus: int,
    allowed_images: Iterable[str] = (),
    profiles: Iterable[str] = (),
    slices: Mapping[str, Mapping[str, int]] | None = None,
) -> SpawnRequest:
    """Check raw user options against what this hub has.

    ``inventory_size`` and ``models`` are the whole GPUs; ``slices`` the MIG
    slices, by profile and model (``{"1g.18gb": {"H200-141GB": 7}}``).
    ``default_gpus`` is used when ``gpus`` is absent. Quota limits are not
    checked here: they depend on who asks and are checked at spawn time.
    """
    options = dict(options or {})
    slices = slices or {}
    unknown = sorted(k for k in options if k not in KNOWN_OPTIONS)
    if unknown:
        raise OptionError(
            f"unknown spawn option(s): {', '.join(repr(k)[:40] for k in unknown)}; "
            f"accepted options are {', '.join(KNOWN_OPTIONS)}"
        )
    gpus = _as_count(options["gpus"]) if options.get("gpus") is not None else default_gpus
    if gpus < 0:
        raise OptionError(f"gpus cannot be negative (asked for {gpus})")
    # Checked even for a CPU server (then dropped), as gpu_model is: a typo is said, not ignored.
    gpu_profile = _gpu_profile(options.get("gpu_profile"), slices)
    if gpu_profile is None and gpus > inventory_size and not (inventory_size == 0 and slices):
        if inventory_size == 0:
            raise OptionError(f"this hub has no GPUs, so it can only start CPU servers (gpus=0), not gpus={gpus}")
        raise OptionError(f"asked for {gpus} GPUs but this hub has only {inventory_size}")

    model = options.get("gpu_model")
    if model is not None:
        if not isinstance(model, str):
            raise OptionError("gpu_model must be a model name such as H100-80GB")
        known = sorted(slices[gpu_profile] if gpu_profile else set(models))
        matches = [m for m in known if m.lower() == model.strip().lower()]
        if not matches:
            shown = ", ".join(known) if known else "none"
            has = f"this hub has {gpu_profile} slices on" if gpu_profile else "this hub has"
            raise OptionError(f"unknown gpu_model {model.strip()[:40]!r}; {has}: {shown}")
        model = matches[0]
    if gpus == 0:
        model = gpu_profile = None

    image = _one_of(options.get("image"), allowed_images, name="image", plural="images")
    profile = _one_of(options.get("profile"), profiles, name="profile", plural="resource profiles", fold_case=True)
    return SpawnRequest(gpus=gpus, gpu_model=model, image=image, profile=profile, gpu_profile=gpu_profile)


def _gpu_profile(value: Any, slices: Mapping[str, Mapping[str, int]]) -> str | None:
    """The MIG profile asked for (None: whole GPUs), one this hub has slices of."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise OptionError("gpu_profile must be a MIG profile such as 1g.18gb")
    choice = value.strip().lower()
    if choice not in slices:
        if not slices:
            raise OptionError(
                f"this hub has no MIG slices, so gpu_profile {choice[:40]!r} cannot be had; "
                "ask for whole GPUs with gpus (and gpu_model)"
            )
        raise OptionError(f"this hub has no MIG slices of {choice[:40]!r}; it has: {slice_summary(slices)}")
    return choice


def slice_summary(slices: Mapping[str, Mapping[str, int]]) -> str:
    """ "1g.18gb (7 on H200-141GB), 3g.40gb (2 on H100-80GB)": the slices a hub has, for sentences."""
    return ", ".join(
        f"{profile} ({', '.join(f'{n} on {model}' for model, n in by_model.items())})"
        for profile, by_model in slices.items()
    )
