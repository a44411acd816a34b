"""The harbor world: tasks others wrote, in Harbor's task-folder format (the one Terminal-Bench 2.0,
TRL, SkyRL and Prime Intellect's verifiers consume), run as they are.

    world: harbor
    dataset: {source: path/to/tasks}      # a task folder, a folder of them, or a list

Each episode builds the task's environment (a Docker container from its Dockerfile when an engine
answers, else a bubblewrap sandbox over the files the Dockerfile copies), lets the agent run shell
commands there in one persistent shell, then runs the task's ``tests/test.sh`` in the same
environment as Harbor runs it: its reward file is the score (no reward file is the world failing),
its output the feedback. ``agent: oracle`` and ``agent: nop`` in a task file select Harbor's own
agents (the task's solution, or nothing) instead of the shell agent. ``solution/`` is never in the agent's
environment. One bad task never stops a run: an invalid, unsupported or broken one is named and
left out with its reason. Nothing a task or an agent writes reaches the host: a task's files and
its environment's are never touched through a link (:mod:`evolve.sandbox.beneath`).

The folder, each part depending only on those above it:

* ``task/`` — the task format: reading one task folder strictly (``task.toml`` keys, timeouts,
  named errors, steps, Harbor's sections, which host variables it may read), never through a link;
* ``environment/`` — where a task runs: the docker and sandbox backends behind one interface
  (``open_environment``), the verifier, the oracle and a step's start as Harbor runs them, the tests'
  verdict and the environment failing (``EnvironmentError_``);
* ``trial`` — an episode's steps in sequence, and the ``oracle`` and ``nop`` agents; ``check`` — is
  a task sound (tests fail untouched, its solution passes), cached; ``cli`` — ``evolve harbor
  check``;
* ``dataset`` — the splits, stable by folder name, bad tasks left out and reported;
* ``agent`` — the shell agent (text protocol: one fenced command per reply, ``DONE``);
  ``reward`` — the tests' verdict; ``hooks`` — memory entries and cold-start demos;
  ``tools`` — recurring commands mined into parametrised shell tools (``tools.mine``), and the
  agent's expansion of a call of one; ``workflow`` — the agent's turn as workflow-graph steps
  (``harbor.act``, ``harbor.think``, ``harbor.review``), its loop as a graph and the topology
  palette (``topology.palette``).
"""

from __future__ import annotations

from evolve.world import World
from evolve.worlds.harbor.agent import (
    DEFAULT_INSTRUCTION,
    agent,
    parse_reply,
    reflexion_agent,
)
from evolve.worlds.harbor.dataset import dataset, split_of
from evolve.worlds.harbor.hooks import demos, experiences, solution_commands
from evolve.worlds.harbor.reward import reward
from evolve.worlds.harbor.task import TaskError, find_tasks, load_task
from evolve.worlds.harbor.tools import mine_commands
from evolve.worlds.harbor.trial import nop, oracle

WORLD = World(
    name="harbor",
    agent="evolve.worlds.harbor:agent",
    reward="evolve.worlds.harbor:reward",
    dataset="evolve.worlds.harbor:dataset",
    hooks={
        "coldstart.demos": "evolve.worlds.harbor:demos",
        "memory.extract": "evolve.worlds.harbor:experiences",
        "tools.mine": "evolve.worlds.harbor:mine_commands",
        "topology.palette": "evolve.worlds.harbor.workflow:PALETTE",
    },
    description="Harbor task folders (instruction.md, task.toml, environment/, tests/); a shell agent in the "
    "task's environment, scored by the task's own tests",
    agents={"oracle": "evolve.worlds.harbor:oracle", "nop": "evolve.worlds.harbor:nop"},
)

__all__ = [
    "DEFAULT_INSTRUCTION",
    "WORLD",
    "TaskError",
    "agent",
    "dataset",
    "demos",
    "experiences",
    "find_tasks",
    "load_task",
    "mine_commands",
    "nop",
    "oracle",
    "parse_reply",
    "reflexion_agent",
    "reward",
    "solution_commands",
    "split_of",
]
