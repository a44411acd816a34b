"""reasoning-gym as a world: its seeded task generators, their difficulty settings and their own
answer scorers (the ``reasoning-gym`` package, Apache-2.0; ``pip install 'evolvekit[reasoning_gym]'``).

    world: reasoning_gym
    dataset:
      params:
        generators:                          # each: a name, or {name, config, levels, weight}
          - {name: basic_arithmetic, config: {min_terms: 2, max_terms: 2, max_digits: 1, operators: ["+", "-"]}}
          - name: spell_backward
            levels: [{max_word_len: 4}, {max_word_len: 6}, {max_word_len: 10}]   # easy to hard
        n_train: 400                         # tasks per split, shared by weight, then by level
        n_val: 100
        n_test: 200
        answer_format: answer_line           # the reply ends with "Answer: <answer>"

A task is a plain JSON dict: ``id, split, generator, level, config, seed, size, index`` (where the
package makes it from), ``question``, ``answer`` (gold) and ``answer_format``.

The folder, each module depending only on those above it:

* ``answer`` — the answer formats: reading an answer from a reply, writing one for a demo;
* ``generators`` — the task file's generators checked, the package's datasets and scorer (cached);
* ``dataset`` — the splits, from disjoint seed ranges;
* ``agent`` — one model call (the ``instruction`` component says the format), the answer read back;
* ``reward`` — the package's score of the answer; feedback that never holds the gold answer;
* ``hooks`` — cold-start demos from the generators' gold answers, memory experiences;
* ``workflow`` — the agent as a graph of generic steps, and the topology palette (vote, reformat);
* ``scripted`` — a scripted solver of fixed skill, for tests and the smoke run.

Importing this package does not import ``reasoning_gym``: that happens when a dataset is built.
``WORLD`` is the :class:`~evolve.world.World` a task file names with ``world: reasoning_gym``.
"""

from __future__ import annotations

from evolve.world import World
from evolve.worlds.reasoning_gym.agent import agent, messages_for, reflexion_agent
from evolve.worlds.reasoning_gym.answer import FORMATS, INSTRUCTIONS, extract, written
from evolve.worlds.reasoning_gym.answer import read as read_answer
from evolve.worlds.reasoning_gym.dataset import dataset
from evolve.worlds.reasoning_gym.hooks import demos, experiences
from evolve.worlds.reasoning_gym.reward import reward

WORLD = World(
    name="reasoning_gym",
    agent="evolve.worlds.reasoning_gym:agent",
    reward="evolve.worlds.reasoning_gym:reward",
    dataset="evolve.worlds.reasoning_gym:dataset",
    hooks={
        "coldstart.demos": "evolve.worlds.reasoning_gym:demos",
        "memory.extract": "evolve.worlds.reasoning_gym:experiences",
        "topology.palette": "evolve.worlds.reasoning_gym.workflow:PALETTE",
    },
    description="reasoning-gym's seeded generators at chosen difficulty levels; the package's own scorers",
)

__all__ = [
    "FORMATS",
    "INSTRUCTIONS",
    "WORLD",
    "agent",
    "dataset",
    "demos",
    "experiences",
    "extract",
    "messages_for",
    "read_answer",
    "reflexion_agent",
    "reward",
    "written",
]
