"""The World protocol: what a task environment provides so that a task file can name it alone.

A world is the tasks, the agent that attempts them and the reward that scores the attempt, plus
optional hooks that layers look up when the task file leaves their setting out::

    world: sql            # a registered name, or an import path "my_pkg.world:WORLD"
    models: {policy: {backend: litellm, name: openai/gpt-4o-mini}}
    dataset: {params: {n_train: 500}}     # the world's dataset(seed=..., **params)

fills ``agent``, ``reward`` and ``dataset.source`` in from the world, and ``cold_start.demos`` and
the operators' world-specific settings from its hooks. Everything stays overridable: a field the
task file sets wins over the world's. A world may name other agents of its own (``agents``), which a
task file selects by that name (``agent: oracle`` in the harbor world).

Hooks (each an import path; a layer that needs one the world lacks asks for its own setting):

===================  ==========================================================================
``coldstart.demos``  ``demos(tasks, *, instruction, seed, augment, ...) -> chats``: SFT demos in
                     the agent's message format, for a local model's cold start
``memory.extract``   ``extract(trajectories, tasks, *, threshold) -> [{kind, text, metadata}]``:
                     the memory operator's entries from solved trajectories
``tools.mine``       ``mine(trajectories, *, tool, sql_arg, db_arg, min_support, taken,
                     provenance) -> [Tool]``: the toolforge operator's abstraction of repeated
                     actions into parametrised tools
``topology.palette`` a list of palette items: the node types the topology search may insert
``eval.summary``     ``summary(tasks, rewards) -> {"lines": [...], ...}``: the world's own figures
                     over a split's scored tasks (a reward None where the rollout failed), which
                     ``evolve eval`` prints and the run report adds
``star.repair``      ``repair(task, reply, *, ended) -> reply | None``: STaR's rationalization,
                     a failed attempt's final reply edited until the reward would pass it
===================  ==========================================================================

Workflow node types a world adds (``sql.write``, ...) are registered like third-party plugins,
through the ``evolvekit.node_types`` entry-point group, so a graph naming them loads anywhere.

A world is registered under a name in :data:`evolve.registry.worlds` (or the entry-point group
``evolvekit.worlds``); ``docs/extending.md`` has a complete example.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evolve.errors import ConfigError

HOOKS = ("coldstart.demos", "memory.extract", "tools.mine", "topology.palette", "eval.summary", "star.repair")


@dataclass(frozen=True)
class World:
    """A task environment (see the module docstring). Every value is an import path, so a world is
    plain data: the task file records what it resolved to, and a resumed run compares it."""

    name: str
    agent: str  # "pkg.mod:fn": agent(task, ctx) -> output
    reward: str  # reward(task, output[, trajectory]) -> float | Reward | {"score": ...}
    dataset: str  # dataset(seed=..., **params) -> {"train": [...], "val": [...], "test": [...]}
    hooks: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    agents: Mapping[str, str] = field(default_factory=dict)  # a name a task file's ``agent`` may give -> import path

    def __post_init__(self) -> None:
        unknown = sorted(set(self.hooks) - set(HOOKS))
        if unknown:
            from evolve.registry import did_you_mean

            raise ConfigError(
                f"world {self.name!r}: unknown hook(s) {unknown}; {did_you_mean(unknown[0], list(HOOKS))}"
            )

    def hook(self, name: str) -> str | None:
        """The import path of hook ``name``, or None when this world does not provide it."""
        if name not in HOOKS:
            raise KeyError(f"no world hook {name!r}; hooks are {list(HOOKS)}")
        return self.hooks.get(name)


def load_world(name: str) -> World:
    """The world registered as ``name`` (:data:`evolve.registry.worlds`), or at the import path ``name``."""
    from evolve.errors import UserError
    from evolve.registry import import_path, worlds

    try:
        obj: Any = worlds.get(name) if (":" not in name or name in worlds) else import_path(name, what="world")
    except UserError as e:
        raise ConfigError(str(e), path="world") from None
    if not isinstance(obj, World):
        raise ConfigError(f"{name!r} is a {type(obj).__name__}, not an evolve.worlds.World", path="world")
    return obj


__all__ = ["HOOKS", "World", "load_world"]
