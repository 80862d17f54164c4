"""The docker lock-down rules: which container settings would undo isolation.

A user container runs with every capability dropped, ``no-new-privileges``,
no Docker socket and only named volumes. Each rule here names one Docker
setting that would undo that (privileged mode, added capabilities, host
devices, the host's namespaces, unconfined security options, sysctls,
another container's volumes, host paths) and says why in a sentence an
operator can act on. The docker backend (``backends/docker/spawner.py``) applies them
at hub start (``check_lockdown``) and on every create call; an operator who
means it lists a setting in ``c.DockerGPUSpawner.allowed_host_config_keys``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ALLOW_TRAIT = "c.DockerGPUSpawner.allowed_host_config_keys"


def _shares_namespace(value: Any) -> bool:
    """True for a namespace mode that joins the host's or another container's."""
    return isinstance(value, str) and (value == "host" or value.startswith("container:"))


def _unsafe_security_opt(opt: Any) -> bool:
    """True for a ``--security-opt`` that turns a kernel protection off.

    Docker takes both ``key=value`` and ``key:value``; a bare
    ``no-new-privileges`` means true. A custom seccomp or AppArmor profile is
    not refused: it is a profile, not the absence of one.
    """
    text = str(opt).strip()
    cut = min((i for i in (text.find("="), text.find(":")) if i >= 0), default=len(text))
    key, value = text[:cut], text[cut + 1 :]
    key, value = key.strip().lower(), value.strip().lower()
    return (
        (key == "no-new-privileges" and value in ("false", "0", "no"))
        or (key in ("seccomp", "apparmor", "systempaths") and value == "unconfined")
        or (key == "label" and value in ("disable", "type:spc_t"))
    )


def _unsafe_security_opts(value: Any) -> bool:
    return any(_unsafe_security_opt(opt) for opt in value or [])


@dataclass(frozen=True)
class Risk:
    """A host-config setting that undoes part of the lock-down.

    ``key`` is the Docker Engine API name (what a container's ``HostConfig``
    and the allow-list use), ``kwarg`` the docker-py keyword that
    ``extra_host_config`` uses for it, ``why`` the harm, said in one clause.
    """

    key: str
    kwarg: str
    why: str
    unsafe: Callable[[Any], bool] = bool
    allowable: bool = True


RISKS: tuple[Risk, ...] = (
    Risk("Privileged", "privileged", "gives the user root on the host"),
    Risk(
        "CapAdd",
        "cap_add",
        "gives back Linux capabilities the lock-down drops (SYS_ADMIN alone is as good as root on the host)",
    ),
    Risk("Devices", "devices", "hands host devices to the user (a GPU device node there bypasses the GPU pinning)"),
    Risk("DeviceCgroupRules", "device_cgroup_rules", "lets the user's container open host devices"),
    Risk("Sysctls", "sysctls", "changes kernel settings for the user's container"),
    Risk(
        "PidMode",
        "pid_mode",
        "lets the user see and signal the processes of the host or of another container",
        _shares_namespace,
    ),
    Risk(
        "NetworkMode",
        "network_mode",
        "puts the user on the network of the host or of another container "
        "(every service on its loopback, other users' servers included)",
        _shares_namespace,
    ),
    Risk("IpcMode", "ipc_mode", "shares memory and semaphores with the host or another container", _shares_namespace),
    Risk("UTSMode", "uts_mode", "shares the host's hostname namespace with the user", _shares_namespace),
    Risk(
        "UsernsMode",
        "userns_mode",
        "turns off user-namespace remapping, so root in the container is root on the host",
        _shares_namespace,
    ),
    Risk("CgroupnsMode", "cgroupns", "shows the user the host's cgroup tree", _shares_namespace),
    Risk(
        "SecurityOpt",
        "security_opt",
        "turns off a kernel protection of the lock-down (no-new-privileges, seccomp, AppArmor or SELinux)",
        _unsafe_security_opts,
    ),
    Risk("VolumesFrom", "volumes_from", "mounts the volumes of another container, such as another user's home"),
    Risk(
        "DeviceRequests",
        "device_requests",
        "would replace the device request GPU Workbench makes from the user's GPU lease, "
        "so users could get GPUs that are not theirs",
        allowable=False,
    ),
)
_RISK_BY_NAME: dict[str, Risk] = {**{r.key: r for r in RISKS}, **{r.kwarg: r for r in RISKS}}
# Host paths: not one value but each entry of a list, so checked on their own.
HOST_PATH_KEYS = {"Binds": "binds", "Mounts": "mounts"}
ALLOWABLE_KEYS: frozenset[str] = frozenset({r.key for r in RISKS if r.allowable} | set(HOST_PATH_KEYS))
# The traits (of DockerSpawner) through which an operator reaches the create call.
LOCKED_SETTINGS = ("extra_host_config", "extra_create_kwargs", "volumes", "read_only_volumes", "mounts", "network_name")


def _sentence(where: str, what: str, why: str, key: str | None) -> str:
    if key is None:
        return f"GPU Workbench: {where} {what}, which {why}; remove it (this cannot be allowed)."
    return f"GPU Workbench: {where} {what}, which {why}; remove it, or list {key!r} in {ALLOW_TRAIT} if you mean it."


def canonical_allowed(names: Iterable[str]) -> tuple[set[str], list[str]]:
    """The allow-list in Docker Engine API names, and a sentence per bad entry.

    Either spelling is accepted (``Privileged`` or ``privileged``,
    ``CapAdd`` or ``cap_add``), so the allow-list can be written the way the
    setting it allows was.
    """
    allowed, problems = set(), []
    aliases = {**{r.kwarg: r.key for r in RISKS}, **{v: k for k, v in HOST_PATH_KEYS.items()}}
    for name in names or ():
        key = aliases.get(name, name)
        if key in ALLOWABLE_KEYS:
            allowed.add(key)
        elif key in _RISK_BY_NAME:
            risk = _RISK_BY_NAME[key]
            problems.append(
                f"GPU Workbench: {ALLOW_TRAIT} lists {name!r}, which cannot be allowed: "
                f"{risk.key} {risk.why}; remove it from the list."
            )
        else:
            problems.append(
                f"GPU Workbench: {ALLOW_TRAIT} lists {name!r}, which is not a setting the "
                f"lock-down refuses; it takes {', '.join(sorted(ALLOWABLE_KEYS))}."
            )
    return allowed, problems


def _binds(value: Any) -> Iterator[tuple[str, bool]]:
    """(source, read-only) of each bind, from the list or dict forms docker-py takes."""
    if isinstance(value, Mapping):
        for source, target in value.items():
            if isinstance(target, Mapping):
                ro = target.get("ro") is True or "ro" in str(target.get("mode", "")).split(",")
            else:
                ro = False
            yield str(source), ro
    elif isinstance(value, (list, tuple)):
        for bind in value:
            parts = str(bind).split(":")
            yield parts[0], len(parts) > 2 and "ro" in parts[2].split(",")


def _either(mount: Mapping[str, Any], *keys: str) -> Any:
    """The value of the first of ``keys`` that ``mount`` has (DockerSpawner's spelling, then the API's)."""
    return next((mount[k] for k in keys if k in mount), None)


def _mounts(value: Any) -> Iterator[tuple[str, str, bool]]:
    """(type, source, read-only) of each mount, in DockerSpawner's or the API's spelling."""
    for mount in value or []:
        if isinstance(mount, Mapping):
            yield (
                str(_either(mount, "type", "Type") or "volume"),
                str(_either(mount, "source", "Source") or ""),
                bool(_either(mount, "read_only", "ReadOnly")),
            )


def _host_path_problems(
    where: str, key: str, entries: Iterable[tuple[str, bool]], allowed: set[str], datasets: str
) -> list[str]:
    problems = []
    for source, read_only in entries:
        if "docker.sock" in source:
            problems.append(
                _sentence(
                    where,
                    f"mounts the Docker socket {source!r} into every user's container",
                    "gives every user root on the host",
                    None,
                )
            )
        elif source.startswith("/") and key not in allowed and not (source == datasets and read_only):
            problems.append(
                _sentence(
                    where,
                    f"mounts the host path {source!r} into every user's container",
                    "lets users reach the host's files (use a named volume instead)",
                    key,
                )
            )
    return problems


def host_config_problems(host: Mapping[str, Any], where: str, allowed: set[str], datasets: str) -> list[str]:
    """Sentences for each lock-down breach in one host config.

    ``host`` is either docker-py keywords (``extra_host_config``) or Docker
    Engine API names (``extra_create_kwargs['host_config']``, the final
    create call); each breach is named the way it was written.
    """
    problems = []
    for name, value in host.items():
        risk = _RISK_BY_NAME.get(name)
        if risk and risk.unsafe(value) and not (risk.allowable and risk.key in allowed):
            key = risk.key if risk.allowable else None
            problems.append(_sentence(where, f"sets {name}={value!r}", risk.why, key))
        elif name in ("Binds", "binds"):
            problems += _host_path_problems(where, "Binds", _binds(value), allowed, datasets)
        elif name in ("Mounts", "mounts"):
            entries = [(source, ro) for kind, source, ro in _mounts(value) if kind == "bind" or "docker.sock" in source]
            problems += _host_path_problems(where, "Mounts", entries, allowed, datasets)
    return problems


def settings_problems(
    settings: Mapping[str, Any], owners: Mapping[str, str], allowed: set[str], datasets: str
) -> list[str]:
    """Sentences for each lock-down breach in DockerSpawner's settings.

    ``settings`` maps the names in LOCKED_SETTINGS to their values (a missing
    one is not set), ``owners`` each name to the config section that set it
    (``c.DockerGPUSpawner``). Callables are skipped: they are only known at
    spawn time, where the final create call is checked.
    """
    problems: list[str] = []

    def where(name: str) -> str:
        return f"{owners.get(name, 'c.DockerGPUSpawner')}.{name}"

    host = settings.get("extra_host_config")
    if isinstance(host, Mapping):
        problems += host_config_problems(host, where("extra_host_config"), allowed, datasets)
    create = settings.get("extra_create_kwargs")
    if isinstance(create, Mapping) and isinstance(create.get("host_config"), Mapping):
        problems += host_config_problems(
            create["host_config"], f"{where('extra_create_kwargs')}['host_config']", allowed, datasets
        )
    for name, read_only in (("volumes", False), ("read_only_volumes", True)):
        volumes = settings.get(name)
        if isinstance(volumes, Mapping):
            entries = [(source, read_only or ro) for source, ro in _binds(volumes)]
            problems += _host_path_problems(where(name), "Binds", entries, allowed, datasets)
    entries = [
        (source, ro)
        for kind, source, ro in _mounts(settings.get("mounts"))
        if kind == "bind" or "docker.sock" in source
    ]
    problems += _host_path_problems(where("mounts"), "Mounts", entries, allowed, datasets)
    network = settings.get("network_name")
    if _shares_namespace(network) and "NetworkMode" not in allowed:
        problems.append(
            _sentence(where("network_name"), f"is {network!r}", _RISK_BY_NAME["NetworkMode"].why, "NetworkMode")
        )
    return problems
