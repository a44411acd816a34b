"""Procedural database schemas: 2-3 linked tables with deterministic rows, in SQLite.

A :class:`Schema` is drawn from one random generator and one side (``"train"`` or
``"test"``, see :mod:`evolve.worlds.sql.vocab`); all its table, column and value words
come from that side. Tables have an integer primary key ``id``, 2-4 further columns
(a unique text "key" column, categorical text columns, integer columns, and foreign keys
``<parent>_id``), and 8-30 rows.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.worlds.sql import vocab

INT_RANGES = ((1, 9), (1, 20), (10, 99), (1, 100), (100, 999), (1950, 2020), (0, 50))
SHAPES = ("pair", "pair", "chain", "star", "fan")  # 2 tables, or 3 tables in 3 layouts


@dataclass
class Column:
    name: str
    kind: str  # "key" (unique text) | "cat" (categorical text) | "int" | "fk"
    ref: str | None = None  # the parent table of a foreign key

    @property
    def is_text(self) -> bool:
        return self.kind in ("key", "cat")


@dataclass
class Table:
    name: str
    columns: list[Column]  # without ``id``
    rows: list[tuple] = field(default_factory=list)  # (id, *values in column order)

    def col(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def values(self, name: str) -> list:
        i = 1 + [c.name for c in self.columns].index(name)
        return [r[i] for r in self.rows]

    def data_columns(self, *kinds: str) -> list[Column]:
        return [c for c in self.columns if c.kind != "fk" and (not kinds or c.kind in kinds)]

    def fks(self) -> list[Column]:
        return [c for c in self.columns if c.kind == "fk"]


@dataclass
class Schema:
    domain: str
    side: str
    tables: list[Table]

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)

    def names(self) -> set[str]:
        """Every table and column name (``id`` excluded; ``x_id`` counted as itself)."""
        return {t.name for t in self.tables} | {c.name for t in self.tables for c in t.columns}

    def render(self) -> str:
        """``schema: pet(id,name,age,owner_id) owner(id,name,city)``"""
        parts = [f"{t.name}(" + ",".join(["id"] + [c.name for c in t.columns]) + ")" for t in self.tables]
        return "schema: " + " ".join(parts)

    def ddl(self) -> list[str]:
        out = []
        for t in self.tables:
            cols = ["id integer primary key"]
            for c in t.columns:
                if c.kind == "fk":
                    cols.append(f"{c.name} integer references {c.ref}(id)")
                else:
                    cols.append(f"{c.name} {'text' if c.is_text else 'integer'}")
            out.append(f"create table {t.name} ({', '.join(cols)})")
        return out

    def connect(self) -> sqlite3.Connection:
        """A fresh in-memory database holding this schema and its rows."""
        conn = sqlite3.connect(":memory:")
        for stmt in self.ddl():
            conn.execute(stmt)
        for t in self.tables:
            marks = ",".join("?" * (1 + len(t.columns)))
            conn.executemany(f"insert into {t.name} values ({marks})", t.rows)
        conn.commit()
        return conn

    def save(self, path: str | Path, conn: sqlite3.Connection | None = None) -> None:
        """Write the database to ``path`` (overwritten)."""
        path = Path(path)
        path.unlink(missing_ok=True)
        src = conn or self.connect()
        try:
            if hasattr(src, "serialize"):  # python >= 3.11: no fsync per file
                path.write_bytes(src.serialize())
                return
            dst = sqlite3.connect(str(path))
            try:
                dst.execute("pragma synchronous = off")
                src.backup(dst)
            finally:
                dst.close()
        finally:
            if conn is None:
                src.close()


class _Namer:
    """Draws distinct names for one schema from one side and one domain."""

    def __init__(self, rng: random.Random, side: str, domain: str) -> None:
        self.rng, self.side = rng, side
        self.used: set[str] = set()
        self.nouns = vocab.NOUNS[domain]

    def _fresh(self, pick) -> str:
        for _ in range(100):
            w = pick()
            if w not in self.used:
                self.used.add(w)
                return w
        w = vocab.pseudo_word(self.rng, self.side)  # pools exhausted: fall back
        while w in self.used:
            w = vocab.pseudo_word(self.rng, self.side)
        self.used.add(w)
        return w

    def table(self) -> str:
        r = self.rng
        return self._fresh(
            lambda: r.choice(self.nouns) if r.random() < 0.6 else vocab.pseudo_word(r, self.side, max_len=7)
        )

    def column(self, kind: str) -> str:
        r = self.rng
        attrs = vocab.ATTRS[f"{'int' if kind == 'int' else 'text'}_{self.side}"]

        def pick() -> str:
            x = r.random()
            if x < 0.4:
                return r.choice(attrs)
            if x < 0.7:
                return r.choice(self.nouns)
            return vocab.pseudo_word(r, self.side)

        return self._fresh(pick)


def _value_words(rng: random.Random, side: str, n: int) -> list[str]:
    """``n`` distinct text values from the side's nouns and pseudo-words."""
    nouns = vocab.side_nouns(side)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        w = rng.choice(nouns) if rng.random() < 0.5 else vocab.pseudo_word(rng, side)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def make_schema(rng: random.Random, side: str, domain: str | None = None) -> Schema:
    """Draw one schema with its rows. Deterministic in the state of ``rng``."""
    domain = domain or rng.choice(vocab.domains(side))
    namer = _Namer(rng, side, domain)
    shape = rng.choice(SHAPES)
    n_tables = 2 if shape == "pair" else 3
    names = [namer.table() for _ in range(n_tables)]
    # parent links by index: child -> parents
    links = {
        "pair": {0: [1]},
        "chain": {0: [1], 1: [2]},
        "star": {0: [1, 2]},
        "fan": {0: [2], 1: [2]},
    }[shape]
    n_rows = [rng.randint(8, 30) for _ in names]
    tables: list[Table] = []
    for i, name in enumerate(names):
        parents = links.get(i, [])
        lo, hi = max(1, 2 - len(parents)), min(3, 4 - len(parents))
        n_data = rng.randint(lo, hi)
        kinds = ["key"] if rng.random() < 0.85 else []
        while len(kinds) < n_data:
            kinds.append("int" if "int" not in kinds or rng.random() < 0.5 else "cat")
        head, tail = kinds[:1], kinds[1:]
        rng.shuffle(tail)
        cols = [Column(namer.column(k), k) for k in head + tail]
        cols += [Column(f"{names[p]}_id", "fk", ref=names[p]) for p in parents]
        tables.append(Table(name, cols))
    for i, t in enumerate(tables):
        n = n_rows[i]
        columns_values = []
        for c in t.columns:
            vals: list[Any]
            if c.kind == "key":
                vals = _value_words(rng, side, n)
            elif c.kind == "cat":
                choices = _value_words(rng, side, rng.randint(2, 4))
                vals = [rng.choice(choices) for _ in range(n)]
            elif c.kind == "int":
                lo, hi = rng.choice(INT_RANGES)
                vals = [rng.randint(lo, hi) for _ in range(n)]
            else:
                assert c.ref is not None  # a foreign key names its parent table
                parent = names.index(c.ref)
                vals = [rng.randint(1, n_rows[parent]) for _ in range(n)]
            columns_values.append(vals)
        t.rows = [(k + 1, *(v[k] for v in columns_values)) for k in range(n)]
    rng.shuffle(tables)
    return Schema(domain=domain, side=side, tables=tables)
