"""Reading WORKBENCH_* values: the small functions every config module shares.

``configurer.py`` (the hub's areas) and each backend's ``config.py``
(``workbench_spawner/backends/<name>/config.py``) read the environment
through these, so a bad value is worded the same way everywhere and no
config module needs to import another (as ``configurer.py`` and the Slurm
backend's config once imported each other). Each takes the ``env`` mapping it is given, never ``os.environ``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import overload

Env = Mapping[str, str]


class ConfigError(ValueError):
    """A WORKBENCH_* value that cannot be used; the message names it and says why."""


# -- reading values ----------------------------------------------------------------


def text(env: Env, name: str, default: str = "") -> str:
    """The variable, stripped; ``default`` only when it is not set at all."""
    return str(env.get(name, default)).strip()


@overload
def number(env: Env, name: str, default: str, kind: type[int]) -> int: ...
@overload
def number(env: Env, name: str, default: str, kind: type[float] = float) -> float: ...
def number(env: Env, name: str, default: str, kind: type[float] | type[int] = float) -> float | int:
    """A non-negative number (``kind=int``: a whole one, typed int for the callers that need one)."""
    value_text = text(env, name, default)
    try:
        value = kind(value_text)
    except ValueError:
        value = -1
    if value < 0:
        whole = "whole " if kind is int else ""
        raise ConfigError(f"{name} must be a non-negative {whole}number, not {value_text!r}")
    return value


def port(env: Env, name: str, default: str) -> int:
    value_text = text(env, name, default)
    if not value_text.isdigit() or not 0 < int(value_text) < 65536:
        raise ConfigError(f"{name} must be a port number, not {value_text!r}")
    return int(value_text)


def flag(env: Env, name: str, default: str) -> bool:
    return text(env, name, default).lower() not in ("0", "false", "no")


def opt_in(env: Env, name: str) -> bool:
    """A switch that lowers a safeguard: on only when clearly said (1, true, yes); empty or unset is off."""
    value = text(env, name).lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name} must be 1 or 0, not {value!r}")


def comma_list(env: Env, name: str, default: str = "") -> list[str]:
    return [item.strip() for item in text(env, name, default).split(",") if item.strip()]
