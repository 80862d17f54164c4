"""Write docs/configuration.md, the reference of every GPU Workbench spawner trait, from the traits' ``help=``.

    python docs/generate_config_reference.py           # (re)write docs/configuration.md
    python docs/generate_config_reference.py --check   # exit 1 with a sentence when the file is not current

The spawner classes are the ``jupyterhub.spawners`` entry points that
``pyproject.toml`` declares (``gpu-local``, ``gpu-docker``, ``gpu-slurm``),
imported by their module path, so the reference is the same whether or not
the package's installed metadata is current. For each one, every class of
its bases that belongs to ``workbench_spawner`` (``GPUSpawnerMixin`` and its
bases ``GPUPolicyConfig``, ``IdlePolicyConfig``, ``ServerSizing``; a
backend's own bases such as ``SlurmTraits``) gets a section with the
configurable traits (``.tag(config=True)``) it defines itself, in
declaration order. Traits of JupyterHub's ``Spawner``, DockerSpawner and
batchspawner are not repeated: the sections link to their own docs, and
name the inherited traits whose default a workbench class changes.

Nothing machine-specific goes into the file: a default computed by an
``@default`` method is shown as "computed" with the help's sentence about
it, never evaluated, and static defaults are checked for this machine's
host name, working directory, home and data dir.

``tests/unit/test_config_reference.py`` runs the check, so CI fails when a
trait's help changes and this file was not run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import re
import socket
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "docs" / "configuration.md"
COMMAND = "python docs/generate_config_reference.py"
PACKAGE = "workbench_spawner"

# Where the traits a workbench class inherits from outside the package are documented.
UPSTREAM_DOCS = {
    "jupyterhub": (
        "JupyterHub's Spawner reference",
        "https://jupyterhub.readthedocs.io/en/stable/reference/api/spawner.html",
    ),
    "dockerspawner": (
        "DockerSpawner's API reference",
        "https://jupyterhub-dockerspawner.readthedocs.io/en/latest/api/index.html",
    ),
    "batchspawner": ("batchspawner's README (its options)", "https://github.com/jupyterhub/batchspawner#readme"),
}


def _ensure_importable() -> None:
    """Running from a checkout without the package installed: put its source folders first on the path."""
    for folder in ("hub", "spawner"):
        path = str(REPO / folder)
        if path not in sys.path:
            sys.path.insert(0, path)


def spawner_entry_points(pyproject: Path = REPO / "pyproject.toml") -> list[tuple[str, str]]:
    """(entry point name, ``module:Class``) of the workbench's spawners, in pyproject.toml's order."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    points = data["project"]["entry-points"]["jupyterhub.spawners"]
    return [(name, value) for name, value in points.items() if value.startswith(PACKAGE + ".")]


def load(value: str) -> type:
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)


def spawner_classes() -> list[tuple[str, type]]:
    """The backends' spawner classes, by entry point name, in pyproject.toml's order."""
    _ensure_importable()
    return [(name, load(value)) for name, value in spawner_entry_points()]


def mixin_class() -> type:
    _ensure_importable()
    from workbench_spawner.mixin import GPUSpawnerMixin

    return GPUSpawnerMixin


# -- reading the traits ------------------------------------------------------------------------------


def own_config_traits(cls: type) -> list[tuple[str, object]]:
    """The configurable traits ``cls`` defines in its own body, in declaration order."""
    from traitlets import TraitType

    return [
        (name, value)
        for name, value in vars(cls).items()
        if isinstance(value, TraitType) and value.metadata.get("config")
    ]


def default_handler(cls: type, name: str):
    """The ``@default(name)`` (or ``_name_default``) method ``cls`` uses, or None for a static default."""
    from traitlets import DefaultHandler

    for klass in cls.__mro__:
        for value in vars(klass).values():
            if isinstance(value, DefaultHandler) and value.trait_name == name:
                return value
        if f"_{name}_default" in vars(klass):
            return vars(klass)[f"_{name}_default"]
        if _is_trait(vars(klass).get(name)):
            return None  # the class that declares the trait, without a generator: its default is static
    return None


def _is_trait(value: object) -> bool:
    from traitlets import TraitType

    return isinstance(value, TraitType)


def help_text(trait) -> str:
    """The trait's help, dedented; RST's ``::`` before a literal block becomes a Markdown colon."""
    text = inspect.cleandoc(trait.help or "")
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def type_name(trait) -> str:
    """``Float`` (min 0), ``List(Unicode)``, ``Enum('fifo', 'fair-share')``..."""
    from traitlets import Container, Dict, Enum

    name = type(trait).__name__
    if isinstance(trait, Enum):
        name += "(" + ", ".join(repr(v) for v in trait.values) + ")"
    elif isinstance(trait, Container) and getattr(trait, "_trait", None) is not None:
        name += f"({type(trait._trait).__name__})"
    elif isinstance(trait, Dict) and getattr(trait, "_value_trait", None) is not None:
        name += f"(values: {type(trait._value_trait).__name__})"
    bounds = [
        f"{word} {_number(getattr(trait, word))}"
        for word in ("min", "max")
        if getattr(trait, word, None) is not None and not _infinite(getattr(trait, word))
    ]
    if getattr(trait, "allow_none", False):
        bounds.append("or None")
    return f"`{name}`" + (f" ({', '.join(bounds)})" if bounds else "")


def _infinite(value: object) -> bool:
    return isinstance(value, float) and math.isinf(value)


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def machine_values() -> dict[str, str]:
    """This machine's values that must never appear in the reference, with what to write instead."""
    values = {
        socket.gethostname(): "<host name>",
        os.getcwd(): "<working directory>",
        str(Path.home()): "<home>",
        sys.prefix: "<Python environment>",
        str(REPO): "<checkout>",
    }
    if os.environ.get("WORKBENCH_DATA_DIR"):
        values[os.environ["WORKBENCH_DATA_DIR"]] = "<data dir>"
    # Longest first, so a path is replaced before a shorter path inside it; never a trivial value.
    return {k: v for k, v in sorted(values.items(), key=lambda kv: -len(kv[0])) if k and k not in ("/", ".")}


def generic(text: str, paths_only: bool = False) -> str:
    """``text`` with this machine's values replaced by placeholders.

    ``paths_only`` (help texts, which are written in the source): only
    absolute paths, so a host name that is also a word stays as written."""
    for value, placeholder in machine_values().items():
        if not paths_only or value.startswith("/"):
            text = text.replace(value, placeholder)
    return text


def default_sentence(help_: str) -> str:
    """What the help says about the default: its sentences that start with "Defaults", else one naming it."""
    sentences = re.split(r"(?<=[.;])\s+(?=[A-Z$(])", " ".join(help_.split()))
    picked = [s for s in sentences if s.startswith("Defaults")]
    if not picked:
        picked = [s for s in sentences if "default" in s.lower()][:1]
    return " ".join(picked)


def default_text(cls: type, name: str, trait) -> str:
    if default_handler(cls, name) is not None:
        said = generic(default_sentence(help_text(trait)), paths_only=True)
        return "computed. " + said if said else "computed (see the help)."
    return f"`{generic(trait.default_value_repr())}`"


# -- the document ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    cls: type
    prefix: str  # the class operators write in the config: c.<prefix>.<name>


def _first_line(cls: type) -> str:
    """The first paragraph of the class's own docstring, else of its module's (never an inherited one)."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or "")
    text = " ".join(doc.split("\n\n", 1)[0].split())
    return text if text.endswith(".") else text + "."


def _where(cls: type) -> str:
    path = inspect.getsourcefile(cls) or ""
    try:
        path = Path(path).resolve().relative_to(REPO).as_posix()
    except ValueError:
        path = cls.__module__.replace(".", "/") + ".py"
    return f"`{path}`"


def workbench_bases(cls: type) -> list[type]:
    """``cls`` and its bases that belong to workbench_spawner, in method resolution order (``cls`` first)."""
    return [k for k in cls.__mro__ if k.__module__.split(".")[0] == PACKAGE]


def upstream_bases(cls: type) -> list[type]:
    """The spawner classes from outside workbench_spawner that ``cls`` builds on, most specific first."""
    from jupyterhub.spawner import Spawner

    return [k for k in cls.__mro__ if k.__module__.split(".")[0] != PACKAGE and issubclass(k, Spawner)]


def upstream_links(cls: type) -> list[str]:
    lines, seen = [], set()
    for klass in upstream_bases(cls):
        package = klass.__module__.split(".")[0]
        title, url = UPSTREAM_DOCS.get(package, (package, ""))
        lines.append(
            f"`{klass.__module__}.{klass.__name__}`" + (f" ([{title}]({url}))" if url and package not in seen else "")
        )
        seen.add(package)
    return lines


def changed_defaults(cls: type) -> list[str]:
    """Inherited configurable traits whose default ``cls`` itself sets (a ``@default`` in its body)."""
    from traitlets import DefaultHandler

    own = {name for name, _ in own_config_traits(cls)}
    traits = cls.class_traits(config=True)
    names = []
    for value in vars(cls).values():
        if isinstance(value, DefaultHandler) and value.trait_name in traits and value.trait_name not in own:
            names.append(value.trait_name)
    by_origin: dict[str, list[str]] = {}
    for name in names:
        origin = next(k for k in cls.__mro__ if _is_trait(vars(k).get(name)))
        by_origin.setdefault(origin.__name__, []).append(f"`{name}`")
    return [", ".join(names) + f" (from `{origin}`)" for origin, names in by_origin.items()]


def _changed_sentence(cls: type) -> str:
    changed = changed_defaults(cls)
    if not changed:
        return ""
    return (
        f"{cls.__name__} gives its own (computed) default to the inherited "
        + "; ".join(changed)
        + "; see the class's source for how."
    )


def trait_block(section: Section, name: str, trait) -> list[str]:
    lines = [
        f"### `c.{section.prefix}.{name}`",
        "",
        f"* Type: {type_name(trait)}",
        f"* Default: {default_text(section.cls, name, trait)}",
        "",
    ]
    text = generic(help_text(trait), paths_only=True)
    lines += [text, ""] if text else ["*(no help text)*", ""]
    return lines


def sections() -> tuple[list[Section], list[tuple[str, type, list[Section]]]]:
    """The core's sections (every backend), and per backend its spawner's sections."""
    mixin = mixin_class()
    core = [Section(k, "GPUSpawnerMixin") for k in workbench_bases(mixin) if own_config_traits(k) or k is mixin]
    core_classes = {s.cls for s in core}
    backends = []
    for point, cls in spawner_classes():
        own = [
            Section(k, cls.__name__)
            for k in workbench_bases(cls)
            if k not in core_classes and (own_config_traits(k) or k is cls)
        ]
        backends.append((point, cls, own))
    return core, backends


def section_block(section: Section) -> list[str]:
    cls = section.cls
    lines = [f"## {cls.__name__}", "", f"{_first_line(cls)} Defined in {_where(cls)}.", ""]
    traits = own_config_traits(cls)
    if not traits:
        lines += ["It defines no configurable trait of its own.", ""]
    for name, trait in traits:
        lines += trait_block(section, name, trait)
    return lines


def render() -> str:
    """The whole of docs/configuration.md."""
    core, backends = sections()
    mixin = mixin_class()
    out = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{COMMAND}` from the traits' help; do not edit by hand. -->",
        "",
        "Every configurable trait GPU Workbench's spawners add to JupyterHub's, with its type, its default and",
        "its help text. Set them in `hub/jupyterhub_config.local.py` (loaded after the `WORKBENCH_*`",
        "environment's settings, see the README): `c.GPUSpawnerMixin.<name>` for every backend, or",
        "`c.<BackendSpawner>.<name>` for one backend's class (the more specific section wins, as traitlets",
        "always does). The GPU policy's settings are resolved once when the hub starts and stored for the",
        "workbench service ([architecture](architecture.md)); a backend's own traits are listed under its",
        "spawner class. Traits inherited from JupyterHub's `Spawner`, DockerSpawner and batchspawner are",
        "documented there, linked from each backend's section. How a backend is built:",
        "[backends](backends.md).",
        "",
        "A default shown as *computed* is made by an `@default` method when the spawner is made (often from",
        "an environment variable); it is never evaluated here, so this page is the same on every machine.",
        "",
        "## Contents",
        "",
        "* [Every backend](#every-backend): "
        + ", ".join(f"[{s.cls.__name__}](#{s.cls.__name__.lower()})" for s in core),
    ]
    for point, cls, _own in backends:
        out.append(f"* [`{point}`: {cls.__name__}](#{_anchor(point, cls)})")
    out += [
        "",
        "## Every backend",
        "",
        f"`{mixin.__name__}` goes first in every backend spawner's bases; its traits and those of its",
        "bases apply to every backend and are set as `c.GPUSpawnerMixin.<name>` (or on one backend's",
        "class). " + _changed_sentence(mixin),
        "",
    ]
    for section in core:
        out += _demote(section_block(section))
    for point, cls, own in backends:
        out += [
            f"## `{point}`: {cls.__name__}",
            "",
            f'`c.JupyterHub.spawner_class = "{point}"` (`WORKBENCH_BACKEND={cls.workbench_backend}`), '
            f"{cls.placement_mode} placement. {_first_line(cls)} Defined in {_where(cls)}.",
            "",
        ]
        bases = upstream_links(cls)
        if bases:
            out += [
                "Inherited traits, not repeated here, are documented with their classes: " + ", ".join(bases) + ".",
                "",
            ]
        if changed_defaults(cls):
            out += [_changed_sentence(cls), ""]
        for section in own:
            if section.cls is cls:
                traits = own_config_traits(cls)
                if not traits:
                    out += [
                        f"{cls.__name__} defines no configurable trait of its own"
                        + (
                            "; its backend's settings are in the sections below."
                            if len(own) > 1
                            else " beyond those of every backend."
                        ),
                        "",
                    ]
                for name, trait in traits:
                    out += _demote(trait_block(section, name, trait))
            else:
                out += _demote(section_block(section))
    return "\n".join(out).rstrip("\n") + "\n"


def _demote(lines: list[str]) -> list[str]:
    """One heading level down (sections inside "Every backend" or a backend)."""
    return ["#" + line if line.startswith("#") else line for line in lines]


def _anchor(point: str, cls: type) -> str:
    heading = f"{point}: {cls.__name__}"
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


# -- the command line -----------------------------------------------------------------------------


def check(path: Path = OUTPUT) -> str:
    """ "" when ``path`` holds what ``render()`` gives, else a sentence saying what to run."""
    expected = render()
    try:
        current = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{_shown(path)} does not exist; run `{COMMAND}` and commit it."
    if current != expected:
        return (
            f"{_shown(path)} is not current: a trait's help, type or default changed since it was "
            f"generated; run `{COMMAND}` and commit the result."
        )
    return ""


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is not current; write nothing")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the file to write or check")
    args = parser.parse_args(argv)
    if args.check:
        problem = check(args.output)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        print(f"{_shown(args.output)} is current.")
        return 0
    args.output.write_text(render(), encoding="utf-8")
    print(f"wrote {_shown(args.output)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
