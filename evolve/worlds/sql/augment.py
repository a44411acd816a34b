"""Name augmentation for SFT demos: the same demo with every table and column renamed.

A demo set of a few hundred questions names only a few hundred tables and columns; a tiny
model trained on it memorises those names instead of learning to copy names from the schema in
its prompt (a throwaway probe: 36% on training-style schemas, 0% on unseen names). Renaming
every name consistently in the schema, the question and the SQL — with fresh made-up words from
the *training* side of the vocabulary, never a test-side word — keeps the demo set small (the
same questions, the same SQL shapes) while making copying the only way to fit it.
"""

from __future__ import annotations

import random
import re

from evolve.worlds.sql.vocab import pseudo_word

_TABLE = re.compile(r"(\w+)\(([^)]*)\)")


def schema_names(schema_text: str) -> tuple[list[str], list[str]]:
    """(tables, columns other than ``id``) named in a rendered schema."""
    tables, cols = [], []
    for table, body in _TABLE.findall(schema_text):
        tables.append(table)
        cols += [c for c in body.split(",") if c and c != "id"]
    return tables, cols


def rename_map(schema_text: str, rng: random.Random) -> dict[str, str]:
    """old name -> fresh training-side word; a foreign key ``t_id`` follows its table ``t``."""
    tables, cols = schema_names(schema_text)
    used: set[str] = set(tables) | set(cols)
    mapping: dict[str, str] = {}

    def fresh() -> str:
        while True:
            w = pseudo_word(rng, "train", max_len=8)
            if w not in used:
                used.add(w)
                return w

    for t in tables:
        mapping[t] = fresh()
    for c in cols:
        if c.endswith("_id") and c[:-3] in mapping:
            mapping[c] = mapping[c[:-3]] + "_id"
        elif c not in mapping:
            mapping[c] = fresh()
    return mapping


def rename_chat(chat: list[dict[str, str]], rng: random.Random) -> list[dict[str, str]]:
    """The chat with every schema name replaced (whole words only) in every message."""
    user = next(m["content"] for m in chat if m["role"] == "user")
    mapping = rename_map(user.split("\n", 1)[0], rng)
    if not mapping:
        return [dict(m) for m in chat]
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)) + r")\b")
    return [{**m, "content": pattern.sub(lambda x: mapping[x.group(1)], m["content"])} for m in chat]
