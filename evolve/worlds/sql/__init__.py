"""The offline SQL-agent world: a miniature of Agent-Lightning's Spider text-to-SQL task.

Procedurally generated SQLite databases (2-3 linked tables, 8-30 rows) with questions from
nine templates (filters, counts, aggregates, order/limit, argmax, joins, group-by counts),
each with paraphrases and a verified canonical gold SQL. Sized for a tiny character-level
model: prompts ``schema: pet(id,name,age,owner_id) owner(id,name,city)\\nq: ...`` stay within
220 characters, gold SQL within 90. Training and test schemas are named from disjoint word
sets (and disjoint domains), so a model must copy names from the prompt to generalise.

    from evolve.worlds import sql
    data = sql.dataset(seed=0, n_train=2000, n_val=200, n_test=300)   # cached on disk
    sft = sql.demos(data["train"])                                      # chat demos
    out = sql.agent(task, ctx)        # multi-turn: write SQL, see errors, rewrite
    r = sql.reward(task, out)         # execution match, components parses/executes/matches

A task is a plain JSON dict: ``id, split, domain, template, db`` (absolute path of its
database), ``schema`` (rendered), ``question``, ``gold_sql``.

The folder, each module depending only on those above it:

* ``vocab``, ``schema``, ``questions``, ``augment`` — the generator: names, schemas, questions
  with gold SQL, renamed copies; ``db`` — safe SQL execution (one read-only SELECT);
* ``dataset`` — the splits, built once per seed and size and cached on disk;
* ``render`` (prompt templates), ``fewshot`` (how demos are shown), ``memory`` (recall of
  experiences), ``tools`` (query tools run in the sandbox) — what a system can put in the prompt;
* ``prompt`` — the messages an episode opens with; ``agent`` — the multi-turn agent;
  ``reward`` — execution match; ``workflow`` — the agent's steps as workflow-graph nodes;
* ``coldstart`` — SFT demos for a local model and the pointer tokenizer's words; ``hooks`` —
  memory entries from solved trajectories; ``abstract`` — repeated SQL shapes mined into
  parametrised query tools.

``WORLD`` is the :class:`~evolve.world.World` a task file names with ``world: sql``.
"""

from __future__ import annotations

from evolve.world import World
from evolve.worlds.sql.abstract import mine_sql as mine_tools
from evolve.worlds.sql.agent import agent, reflexion_agent
from evolve.worlds.sql.coldstart import corrupt, demos, fewshot_demos, memory_demos, name_words, tool_demos
from evolve.worlds.sql.dataset import build, dataset
from evolve.worlds.sql.db import SQLError, execute
from evolve.worlds.sql.hooks import experiences
from evolve.worlds.sql.prompt import messages_for
from evolve.worlds.sql.questions import MAX_PROMPT, MAX_SQL, TEMPLATES, prompt_text
from evolve.worlds.sql.reward import reward

WORLD = World(
    name="sql",
    agent="evolve.worlds.sql:agent",
    reward="evolve.worlds.sql:reward",
    dataset="evolve.worlds.sql:dataset",
    hooks={
        "coldstart.demos": "evolve.worlds.sql:demos",
        "memory.extract": "evolve.worlds.sql:experiences",
        "tools.mine": "evolve.worlds.sql:mine_tools",
        "topology.palette": "evolve.worlds.sql.workflow:PALETTE",
    },
    description="procedurally generated SQLite databases and questions; execution-match reward",
)

__all__ = [
    "MAX_PROMPT",
    "WORLD",
    "MAX_SQL",
    "SQLError",
    "TEMPLATES",
    "agent",
    "build",
    "corrupt",
    "dataset",
    "demos",
    "execute",
    "experiences",
    "fewshot_demos",
    "memory_demos",
    "messages_for",
    "mine_tools",
    "name_words",
    "prompt_text",
    "reflexion_agent",
    "reward",
    "tool_demos",
]
