"""Storing systems and reading their records and lineage (mixed into the Archive)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.archive._codec import chunks, pack, unpack
from evolve.archive.records import SystemRecord
from evolve.errors import ArchiveError
from evolve.types import Candidate, System, canonical_json


class SystemsMixin:
    """Systems & lineage, mixed into :class:`~evolve.archive.Archive` (which provides the
    connection plumbing: ``_read``, ``_write``)."""

    run_dir: Path
    path: Path
    compress: int
    _read: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    _write: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    current: Callable[[], str | None]
    best: Callable[..., str | None]

    def add_system(
        self,
        system: System,
        *,
        parents: Sequence[str] = (),
        operator: str = "init",
        rationale: str = "",
        generation: int = 0,
        info: dict[str, Any] | None = None,
    ) -> str:
        """Store a system (once, by id) with its lineage; return its id.

        Parents must already be in the archive (full ids). Adding an id that is already
        stored changes nothing: the first record stands. When it comes back with other
        parents (an operator rediscovered an existing system) that is noted in
        :meth:`rediscoveries`, not in the lineage, so the lineage stays a DAG.
        """
        if not isinstance(system, System):
            raise TypeError(f"add_system expects a System, got {type(system).__name__}")
        if isinstance(parents, str):
            raise TypeError("parents must be a sequence of system ids, not a string")
        parents = tuple(parents)
        sid = system.id
        now = time.time()
        enc, blob = pack(canonical_json(system.model_dump(mode="json")), self.compress)
        info_json = json.dumps(info or {}, sort_keys=True, ensure_ascii=False)
        with self._write() as c:
            wanted = list(dict.fromkeys((sid, *parents)))
            known: set[str] = set()
            for chunk in chunks(wanted):
                q = f"SELECT id FROM systems WHERE id IN ({','.join('?' * len(chunk))})"
                known.update(r[0] for r in c.execute(q, tuple(chunk)))
            if sid in known:
                old = tuple(
                    r[0] for r in c.execute("SELECT parent FROM lineage WHERE child = ? ORDER BY position", (sid,))
                )
                if old != parents:
                    c.execute(
                        "INSERT INTO rediscoveries (id, parents, operator, rationale, generation, created_at) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (sid, json.dumps(list(parents)), operator, rationale, int(generation), now),
                    )
                return sid
            missing = [p for p in parents if p not in known]
            if missing:
                raise ArchiveError(f"unknown parent system(s) {', '.join(missing)}: add the parents first")
            c.execute(
                "INSERT INTO systems (id, operator, rationale, generation, info, created_at, enc, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, operator, rationale, int(generation), info_json, now, enc, blob),
            )
            if parents:
                c.executemany(
                    "INSERT INTO lineage (child, position, parent, operator, rationale, generation, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(sid, i, p, operator, rationale, int(generation), now) for i, p in enumerate(parents)],
                )
        return sid

    def add_candidate(self, candidate: Candidate, *, generation: int = 0) -> str:
        """:meth:`add_system` for a :class:`~evolve.types.Candidate`."""
        return self.add_system(
            candidate.system,
            parents=candidate.parents,
            operator=candidate.operator,
            rationale=candidate.rationale,
            generation=generation,
            info=dict(candidate.info),
        )

    def has_system(self, system_id: str) -> bool:
        """Whether this exact id is stored."""
        with self._read() as c:
            return c.execute("SELECT 1 FROM systems WHERE id = ?", (system_id,)).fetchone() is not None

    def _resolve_prefix(self, c: sqlite3.Connection, ref: str) -> str:
        p = ref.strip().lower()
        if not p:
            raise ArchiveError("empty system id")
        if c.execute("SELECT 1 FROM systems WHERE id = ?", (p,)).fetchone():
            return p
        rows = [
            r[0]
            for r in c.execute(
                "SELECT id FROM systems WHERE id >= ? AND id < ? ORDER BY id LIMIT 11", (p, p + "\uffff")
            )
        ]
        if not rows:
            raise ArchiveError(f"no system {ref!r} in {self.run_dir}")
        if len(rows) > 1:
            shown = ", ".join(rows[:10]) + (", ..." if len(rows) > 10 else "")
            raise ArchiveError(f"ambiguous system id prefix {ref!r}: it matches {shown}; give more characters")
        return rows[0]

    def resolve(self, ref: str) -> str:
        """A full system id from a unique id prefix or one of the words ``current``,
        ``best`` (highest val score) and ``baseline`` (the first generation-0 system)."""
        word = ref.strip().lower()
        if word == "current":
            cur = self.current()
            if cur is None:
                raise ArchiveError(f"no current system in {self.run_dir} yet")
            return cur
        if word == "best":
            best = self.best()
            if best is None:
                raise ArchiveError(f"no system in {self.run_dir} has a val score yet")
            return best
        if word == "baseline":
            with self._read() as c:
                row = c.execute("SELECT id FROM systems ORDER BY (generation != 0), seq LIMIT 1").fetchone()
            if row is None:
                raise ArchiveError(f"the archive {self.run_dir} holds no system")
            return row[0]
        with self._read() as c:
            return self._resolve_prefix(c, ref)

    def get_system(self, id_or_unique_prefix: str) -> System:
        """The stored system (also accepts ``current``/``best``/``baseline``)."""
        sid = self.resolve(id_or_unique_prefix)
        with self._read() as c:
            row = c.execute("SELECT enc, data FROM systems WHERE id = ?", (sid,)).fetchone()
        if row is None:  # pragma: no cover - resolve() checked it
            raise ArchiveError(f"no system {id_or_unique_prefix!r} in {self.run_dir}")
        system = System.model_validate_json(unpack(row[0], row[1]))
        if system.id != sid:
            raise ArchiveError(f"system {sid} is damaged in {self.path}: its content hashes to {system.id}")
        return system

    def _records(self, where: str = "", args: tuple[Any, ...] = ()) -> list[SystemRecord]:
        with self._read() as c:
            rows = c.execute(
                f"SELECT id, operator, rationale, generation, created_at, info FROM systems {where} ORDER BY seq", args
            ).fetchall()
            if where:
                ids = [r[0] for r in rows]
                edges = []
                for chunk in chunks(ids):
                    q = f"SELECT child, position, parent FROM lineage WHERE child IN ({','.join('?' * len(chunk))})"
                    edges += c.execute(q, tuple(chunk)).fetchall()
            else:
                edges = c.execute("SELECT child, position, parent FROM lineage").fetchall()
        parents: dict[str, list[tuple[int, str]]] = {}
        for child, pos, parent in edges:
            parents.setdefault(child, []).append((pos, parent))
        return [
            SystemRecord(
                id=r[0],
                parents=tuple(p for _, p in sorted(parents.get(r[0], ()))),
                operator=r[1],
                rationale=r[2],
                generation=r[3],
                created_at=r[4],
                info=json.loads(r[5]),
            )
            for r in rows
        ]

    def records(self) -> list[SystemRecord]:
        """Every system's record, in insertion order."""
        return self._records()

    def record(self, system_id: str) -> SystemRecord:
        """One system's record (id, prefix or word)."""
        sid = self.resolve(system_id)
        return self._records("WHERE id = ?", (sid,))[0]

    def lineage(self, system_id: str) -> list[str]:
        """The chain ``[system_id, parent, grandparent, ..., root]`` following first parents."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                """WITH RECURSIVE chain(id, depth) AS (
                       SELECT ?, 0
                       UNION ALL
                       SELECT l.parent, chain.depth + 1 FROM lineage l JOIN chain
                         ON l.child = chain.id AND l.position = 0 WHERE chain.depth < 1000000
                   ) SELECT id FROM chain ORDER BY depth""",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def ancestors(self, system_id: str) -> list[str]:
        """Every ancestor through all parents (crossover included), nearest first."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                """WITH RECURSIVE anc(id, depth) AS (
                       SELECT parent, 1 FROM lineage WHERE child = ?
                       UNION
                       SELECT l.parent, anc.depth + 1 FROM lineage l JOIN anc ON l.child = anc.id
                         WHERE anc.depth < 1000000
                   ) SELECT id, MIN(depth) AS d FROM anc GROUP BY id ORDER BY d, id""",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def children(self, system_id: str) -> list[str]:
        """The systems that name this one as a parent, in insertion order."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                "SELECT DISTINCT l.child FROM lineage l JOIN systems s ON s.id = l.child WHERE l.parent = ? ORDER BY s.seq",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def rediscoveries(self, system_id: str | None = None) -> list[dict[str, Any]]:
        """Times an already-stored system was added again with other parents."""
        q = "SELECT id, parents, operator, rationale, generation, created_at FROM rediscoveries"
        args: tuple[Any, ...] = ()
        if system_id is not None:
            q += " WHERE id = ?"
            args = (system_id,)
        with self._read() as c:
            rows = c.execute(q + " ORDER BY seq", args).fetchall()
        return [
            {
                "id": r[0],
                "parents": json.loads(r[1]),
                "operator": r[2],
                "rationale": r[3],
                "generation": r[4],
                "created_at": r[5],
            }
            for r in rows
        ]

    def system_count(self) -> int:
        """How many systems are stored. (No ``__len__``: an empty Archive must stay truthy.)"""
        with self._read() as c:
            return int(c.execute("SELECT COUNT(*) FROM systems").fetchone()[0])
