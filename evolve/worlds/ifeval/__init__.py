"""IFEval as a world: Google's instruction-following eval (Zhou et al. 2023, arXiv 2311.07911),
scored exactly as its reference implementation scores it, with training prompts generated offline
that never touch its test prompts (``pip install 'evolvekit[ifeval]'``).

    world: ifeval
    dataset:
      params:
        path: input_data.jsonl    # IFEval's 541 prompts (relative to the task file): the test split
        n_train: 1000             # generated prompts, seeded by the run's seed
        n_val: 100
        # n_test: 200             # a fixed random subset of the file (test_seed 0), the same on every seed
        # test: unseen            # or: generated prompts whose constraint parameters were held out of training
        # n_unseen: 200           # the ``unseen`` split beside the file's test: evolve eval ... --split unseen

A task is ``id, split, prompt, instruction_id_list, kwargs`` (``key`` too for a prompt of the
file). The agent sends the prompt as the one user message (``workflow.max_tokens``: 1,280); the
reward's score is the share of instructions followed (strict), its components what the four
benchmark figures are made of; ``evolve eval`` and the run report print those figures beside the
SmolLM2 model cards' scores.

The folder, each module depending only on those above it:

* ``checks`` — the 25 instruction checkers and the strict and loose verdicts;
* ``requests`` — the base requests of generated prompts;
* ``generate`` — generated prompts: requests plus constraints with new parameters;
* ``dataset`` — the splits: the test file, generated train and val;
* ``agent`` — one model call; the draft-measure-revise agent (``agent: revise``);
* ``tools`` — what an agent can measure on its own draft (counts, never a verdict);
* ``reward`` — the checkers' verdicts as a reward; feedback never given on a test prompt;
* ``repair`` — STaR's rationalization: the model's reply to a generated prompt edited until it
  follows every instruction (never a test prompt);
* ``scoring`` — the four figures, their intervals and the model cards' scores;
* ``hooks`` — memory experiences, the ``eval.summary`` hook;
* ``workflow`` — the agent as a graph, the ``ifeval.revise`` step and the topology palette.

IFEval's prompts are evaluation data: no hook reads them for demos, memories or selection.
"""

from __future__ import annotations

from evolve.world import World
from evolve.worlds.ifeval.agent import agent, messages_for, revise_agent
from evolve.worlds.ifeval.checks import CHECKS, verdicts
from evolve.worlds.ifeval.dataset import dataset, read_prompts
from evolve.worlds.ifeval.hooks import experiences
from evolve.worlds.ifeval.reward import reward
from evolve.worlds.ifeval.scoring import CARDS, summary

WORLD = World(
    name="ifeval",
    agent="evolve.worlds.ifeval:agent",
    reward="evolve.worlds.ifeval:reward",
    dataset="evolve.worlds.ifeval:dataset",
    hooks={
        "memory.extract": "evolve.worlds.ifeval:experiences",
        "eval.summary": "evolve.worlds.ifeval:summary",
        "topology.palette": "evolve.worlds.ifeval.workflow:PALETTE",
        "star.repair": "evolve.worlds.ifeval.repair:repair",
    },
    agents={"revise": "evolve.worlds.ifeval:revise_agent"},
    description="IFEval's prompts as the test split, scored by its reference checkers; generated training prompts",
)

__all__ = [
    "CARDS",
    "CHECKS",
    "WORLD",
    "agent",
    "dataset",
    "experiences",
    "messages_for",
    "read_prompts",
    "revise_agent",
    "reward",
    "summary",
    "verdicts",
]
