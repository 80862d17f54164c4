"""Reading a spawner's settings at hub start, without a spawner (a spawner needs a user).

The hub checks and resolves some settings once, from the final config, through a small
``Configurable`` whose ``section_names`` are the spawner class's (``c.Spawner``,
``c.GPUSpawnerMixin``, ``c.LocalGPUSpawner``...). Those sections hold every other option of
the spawner too, which traitlets would report one by one as "not recognized": noise at every
start, not a mistake of the operator's. ``quietly`` makes such a reader without it.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

from traitlets.config import Config, Configurable

Reader = TypeVar("Reader", bound=Configurable)


def quietly(reader: type[Reader], config: Config) -> Reader:
    """``reader(config=config)``, without traitlets' warnings about the options that are not its own."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=rf"Config option .* not recognized by `{reader.__name__}`")
        return reader(config=config)
