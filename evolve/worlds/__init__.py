"""Worlds: task environments, each its tasks, the agent that attempts them, the reward that scores
the attempt, and the hooks the layers use (:mod:`evolve.worlds.base`, the World protocol).

* ``base`` — :class:`~evolve.worlds.base.World` and :func:`~evolve.worlds.base.load_world`;
* ``sql/`` — the offline default: procedurally generated SQLite databases and questions, a
  multi-turn SQL agent, execution-match reward (``world: sql``);
* ``reasoning_gym/`` — reasoning-gym's seeded generators at the difficulty levels the task file
  names, scored by the package's own scorers (``world: reasoning_gym``);
* ``toy`` — a + b with a scripted model, for plumbing tests and examples (``world: toy``).

A task file names one with ``world: NAME`` (registered in :data:`evolve.registry.worlds` or through
the ``evolvekit.worlds`` entry-point group) or ``world: package.module:WORLD``.
"""

from evolve.worlds.base import HOOKS, World, load_world

__all__ = ["HOOKS", "World", "load_world"]
