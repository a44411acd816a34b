"""Worlds: task environments, each its tasks, the agent that attempts them, the reward that scores
the attempt, and the hooks the layers use (the World protocol, :class:`~evolve.world.World` and
:func:`~evolve.world.load_world`, which live in the foundations so that the core reads a task file's
``world:`` without depending on the worlds; re-exported here).

* ``sql/`` — the offline default: procedurally generated SQLite databases and questions, a
  multi-turn SQL agent, execution-match reward (``world: sql``);
* ``reasoning_gym/`` — reasoning-gym's seeded generators at the difficulty levels the task file
  names, scored by the package's own scorers (``world: reasoning_gym``);
* ``toy`` — a + b with a scripted model, for plumbing tests and examples (``world: toy``).
* ``experiences`` — the ``memory.extract`` hook written once (:func:`~evolve.worlds.experiences.solved_entries`);
  each world's hooks live in its ``hooks.py``.

A task file names one with ``world: NAME`` (registered in :data:`evolve.registry.worlds` or through
the ``evolvekit.worlds`` entry-point group) or ``world: package.module:WORLD``.
"""

from evolve.world import HOOKS, World, load_world

__all__ = ["HOOKS", "World", "load_world"]
