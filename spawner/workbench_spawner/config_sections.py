"""Reading a spawner's settings at hub start, without a spawner (a spawner needs a user).

The hub checks and resolves some settings once, from the final config, through a small
``Configurable`` (a reader) made to read the spawner class's ``section_names`` (``c.Spawner``,
``c.GPUSpawnerMixin``, ``c.LocalGPUSpawner``...), most specific last, as the spawner would. Those
sections hold every other option of the spawner too, which traitlets would report one by one as
"not recognized": noise at every start, not a mistake of the operator's. ``read_as`` reads without it.
"""

from __future__ import annotations

import warnings
from typing import TypeVar, cast

from traitlets.config import Config, Configurable

Reader = TypeVar("Reader", bound=Configurable)


def read_as(reader: type[Reader], spawner_class: type[Configurable], config: Config) -> Reader:
    """``reader``'s traits read from ``config`` as ``spawner_class`` reads them (its config sections and its
    bases'), without traitlets' warnings about the options that are not the reader's."""
    sections = classmethod(lambda cls: spawner_class.section_names())
    as_spawner = cast("type[Reader]", type(reader.__name__, (reader,), {"section_names": sections}))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=rf"Config option .* not recognized by `{reader.__name__}`")
        return as_spawner(config=config)
