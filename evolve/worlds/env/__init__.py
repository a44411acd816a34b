"""The env world: OpenEnv-style environments (``reset`` / ``step`` answering observation, reward
and done), over OpenEnv's WebSocket protocol or plain HTTP, each episode a seed.

    world: env
    dataset: {params: {url: http://127.0.0.1:8000}}       # a server that is running
    dataset: {params: {server: "wordgame:app"}}           # or an ASGI app the world starts on loopback

A multi-turn agent plays each episode (the model's reply is the action, the observation the next
message); the environment's rewards are the score; every reset and step is recorded in the
trajectory. A server that is down, hangs or answers garbage is the world failing (never a score).

The folder, each module depending only on those above it:

* ``client`` — the two transports, the protocol's answers checked, failures told apart;
* ``launch`` — an ASGI app given as an import path, served on loopback once per process;
* ``dataset`` — the episodes' seeds per split, the server asked once before the run;
* ``agent`` — the episode loop; ``reward`` — the environment's rewards and the feedback;
  ``hooks`` — memory entries from rewarded episodes.
"""

from __future__ import annotations

from evolve.world import World
from evolve.worlds.env.agent import DEFAULT_INSTRUCTION, agent, reflexion_agent, render, to_action
from evolve.worlds.env.dataset import dataset
from evolve.worlds.env.hooks import experiences
from evolve.worlds.env.reward import reward

WORLD = World(
    name="env",
    agent="evolve.worlds.env:agent",
    reward="evolve.worlds.env:reward",
    dataset="evolve.worlds.env:dataset",
    hooks={"memory.extract": "evolve.worlds.env:experiences"},
    description="OpenEnv-style environments over HTTP or WebSocket (reset/step); a multi-turn agent, scored by "
    "the environment's rewards",
)

__all__ = [
    "DEFAULT_INSTRUCTION",
    "WORLD",
    "agent",
    "dataset",
    "experiences",
    "reflexion_agent",
    "render",
    "reward",
    "to_action",
]
