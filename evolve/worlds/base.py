"""Deprecated: the World protocol is :mod:`evolve.world` now (a foundation module, so that the task
file's ``world:`` is read without the core depending on the worlds). Import :class:`World` from
there or from :mod:`evolve.worlds`; this module warns and will be removed."""

import warnings

from evolve.world import HOOKS, World, load_world

warnings.warn(
    "evolve.worlds.base is deprecated: import World and load_world from evolve.world (or evolve.worlds)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["HOOKS", "World", "load_world"]
