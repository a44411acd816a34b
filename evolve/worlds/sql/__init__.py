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
"""

from __future__ import annotations

from evolve.worlds.sql.agent import SQLError, agent, execute, messages_for, reward
from evolve.worlds.sql.dataset import build, corrupt, dataset, demos, name_words
from evolve.worlds.sql.fewshot import fewshot_demos
from evolve.worlds.sql.memory import memory_demos
from evolve.worlds.sql.questions import MAX_PROMPT, MAX_SQL, TEMPLATES, prompt_text
from evolve.worlds.sql.tools import tool_demos

__all__ = [
    "MAX_PROMPT",
    "MAX_SQL",
    "SQLError",
    "TEMPLATES",
    "agent",
    "build",
    "corrupt",
    "dataset",
    "demos",
    "execute",
    "fewshot_demos",
    "memory_demos",
    "messages_for",
    "name_words",
    "prompt_text",
    "reward",
    "tool_demos",
]
