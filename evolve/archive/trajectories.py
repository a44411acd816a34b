"""Storing trajectories and reading them and their scores back (mixed into the Archive)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

from evolve.archive._codec import chunks, finite, pack, unpack
from evolve.archive.records import TrajectoryRow
from evolve.types import LLMCall, Trajectory


class TrajectoriesMixin:
    """Trajectories & scores, mixed into :class:`~evolve.archive.Archive` (which provides the
    connection plumbing: ``_read``, ``_write``)."""

    compress: int
    _usage_delta: dict[str, dict[str, Any]]
    _read: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    _write: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]

    def add_trajectories(self, rows: Sequence[tuple[str, str, str, int, Trajectory]]) -> int:
        """Store ``(key, split, phase, generation, trajectory)`` rows in one transaction.

        A key already stored is skipped (so replaying a batch after a crash never duplicates).
        Returns how many rows were new.
        """
        now = time.time()
        rows = list(rows)
        for key, _, _, _, traj in rows:
            if not isinstance(key, str) or not key:
                raise TypeError(f"trajectory key must be a non-empty string, got {key!r}")
            if not isinstance(traj, Trajectory):
                raise TypeError(f"expected a Trajectory for key {key!r}, got {type(traj).__name__}")
        if not rows:
            return 0
        # Serialize only rows not stored yet (a replayed batch costs a lookup, not a re-encode);
        # the transaction below checks again, so this is only an optimization.
        stored = self.has_keys([r[0] for r in rows])
        prepared: list[tuple[tuple[Any, ...], Any, bytes]] = []  # (the row's columns, encoding, data)
        for key, split, phase, generation, traj in rows:
            if key in stored:
                continue
            stored.add(key)  # a key repeated within the batch: the first row wins
            enc, blob = pack(traj.model_dump_json(), self.compress)
            reward = traj.reward
            prepared.append(
                (
                    (
                        key,
                        split,
                        phase,
                        int(generation),
                        traj.system_id,
                        traj.task_id,
                        traj.sample,
                        finite(reward.score if reward is not None else 0.0),
                        int(traj.error is not None),
                        int(reward is not None and reward.error is not None),
                        int(traj.tokens),
                        finite(traj.cost),
                        now,
                        sum(1 for s in traj.steps if isinstance(s, LLMCall)),
                        finite(traj.duration),
                    ),
                    enc,
                    blob,
                )
            )
        if not prepared:
            return 0
        with self._write() as c:
            # Skip keys already stored (or repeated in this batch), then insert the rest with
            # explicit row ids: two executemany calls instead of two statements per row.
            seen = self._has_keys(c, [m[0] for m, _, _ in prepared])
            fresh: list[tuple[tuple[Any, ...], Any, bytes]] = []
            for item in prepared:
                if item[0][0] not in seen:
                    seen.add(item[0][0])
                    fresh.append(item)
            if not fresh:
                return 0
            start = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectories").fetchone()[0]
            c.executemany(
                "INSERT INTO trajectories (seq, key, split, phase, generation, system_id, task_id, sample, "
                "score, error, reward_error, tokens, cost, created_at, calls, duration) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(start + i, *meta) for i, (meta, _, _) in enumerate(fresh)],
            )
            c.executemany(
                "INSERT INTO trajectory_data (seq, enc, data) VALUES (?, ?, ?)",
                [(start + i, enc, blob) for i, (_, enc, blob) in enumerate(fresh)],
            )
            for part in ("all", "test"):
                counted = [m for m, _, _ in fresh if part == "all" or m[1] == "test"]
                delta = self._usage_delta[part]
                delta["rollouts"] += len(counted)
                delta["tokens"] += sum(m[10] for m in counted)
                delta["cost"] += sum(m[11] for m in counted)
                delta["calls"] += sum(m[13] for m in counted)
        return len(fresh)

    @staticmethod
    def _has_keys(c: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for chunk in chunks(keys):
            q = f"SELECT key FROM trajectories WHERE key IN ({','.join('?' * len(chunk))})"
            found.update(r[0] for r in c.execute(q, tuple(chunk)))
        return found

    def has_keys(self, keys: Sequence[str]) -> set[str]:
        """The subset of ``keys`` already stored."""
        with self._read() as c:
            return self._has_keys(c, keys)

    def get_trajectories(self, keys: Sequence[str]) -> dict[str, Trajectory]:
        """The stored trajectories among ``keys`` (missing keys are left out)."""
        keys = list(dict.fromkeys(keys))
        raw: list[tuple[str, int, bytes]] = []
        with self._read() as c:
            for chunk in chunks(keys):
                q = (
                    "SELECT t.key, d.enc, d.data FROM trajectories t JOIN trajectory_data d ON d.seq = t.seq "
                    f"WHERE t.key IN ({','.join('?' * len(chunk))})"
                )
                raw += c.execute(q, tuple(chunk)).fetchall()
        return {k: Trajectory.model_validate_json(unpack(enc, data)) for k, enc, data in raw}

    def outcomes(
        self,
        *,
        keys: Sequence[str] = (),
        system_ids: Sequence[str] = (),
        split: str = "train",
        generations: Sequence[int] = (),
        explore: bool = False,
    ) -> dict[str, tuple[str, float, bool]]:
        """``key -> (task id, score, failed)`` without decoding the trajectories: the rollouts among
        ``keys``, and with ``explore`` also every non-evaluation rollout (an operator's samples) of
        ``system_ids`` on ``split`` made in ``generations``."""
        out: dict[str, tuple[str, float, bool]] = {}
        cols = "key, task_id, score, error"
        with self._read() as c:
            for chunk in chunks(list(dict.fromkeys(keys))):
                q = f"SELECT {cols} FROM trajectories WHERE key IN ({','.join('?' * len(chunk))})"
                out.update({k: (t, float(s), bool(e)) for k, t, s, e in c.execute(q, tuple(chunk))})
            if explore and system_ids and generations:
                ids, gens = list(dict.fromkeys(system_ids)), sorted({int(g) for g in generations})
                q = (
                    f"SELECT {cols} FROM trajectories WHERE phase != 'eval' AND split = ? AND "
                    f"system_id IN ({','.join('?' * len(ids))}) AND generation IN ({','.join('?' * len(gens))})"
                )
                out.update({k: (t, float(s), bool(e)) for k, t, s, e in c.execute(q, (split, *ids, *gens))})
        return out

    def trajectory_rows(
        self,
        system_id: str | None = None,
        split: str | None = None,
        phase: str | None = None,
        *,
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[TrajectoryRow]:
        """Stored trajectories with their key/split/phase/generation, in insertion order."""
        where, args = [], []
        for col, val in (
            ("t.system_id", system_id),
            ("t.split", split),
            ("t.phase", phase),
            ("t.generation", generation),
        ):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        q = (
            "SELECT t.key, t.split, t.phase, t.generation, d.enc, d.data FROM trajectories t "
            "JOIN trajectory_data d ON d.seq = t.seq"
        )
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY t.seq"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        with self._read() as c:
            raw = c.execute(q, tuple(args)).fetchall()
        return [
            TrajectoryRow(
                key=k, split=s, phase=p, generation=g, trajectory=Trajectory.model_validate_json(unpack(enc, data))
            )
            for k, s, p, g, enc, data in raw
        ]

    def trajectories(
        self,
        system_id: str | None = None,
        split: str | None = None,
        phase: str | None = None,
        *,
        limit: int | None = None,
    ) -> list[Trajectory]:
        """Stored trajectories matching the filters, in insertion order."""
        return [r.trajectory for r in self.trajectory_rows(system_id, split, phase, limit=limit)]

    # ------------------------------------------------------------------ scores

    def score(self, system_id: str, split: str, phase: str = "eval") -> tuple[float, int] | None:
        """``(mean score, n)`` over the system's trajectories of that split and phase, or None.
        A trajectory without a reward counts as 0."""
        with self._read() as c:
            mean, n = c.execute(
                "SELECT AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? AND split = ? AND phase = ?",
                (system_id, split, phase),
            ).fetchone()
        return None if not n else (float(mean), int(n))

    def task_scores(
        self, system_id: str, split: str, phase: str = "eval", *, samples: int | None = None
    ) -> dict[str, float]:
        """``task_id -> mean score over samples`` for the system on that split and phase
        (with ``samples``: over the sample indices below it only)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT task_id, AVG(score) FROM trajectories WHERE system_id = ? AND split = ? AND phase = ? "
                "AND sample < ? GROUP BY task_id ORDER BY task_id",
                (system_id, split, phase, samples if samples is not None else 1 << 62),
            ).fetchall()
        return {t: float(s) for t, s in rows}

    def scores(self, system_id: str, phase: str = "eval") -> dict[str, tuple[float, int]]:
        """``split -> (mean score, n)`` for the system (phase ``eval`` by default)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? AND phase = ? "
                "GROUP BY split ORDER BY split",
                (system_id, phase),
            ).fetchall()
        return {s: (float(m), int(n)) for s, m, n in rows}

    def score_summary(self, system_id: str) -> list[tuple[str, str, float, int]]:
        """``(split, phase, mean score, n)`` for every split and phase the system was run on."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, phase, AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? "
                "GROUP BY split, phase ORDER BY split, phase",
                (system_id,),
            ).fetchall()
        return [(s, p, float(m), int(n)) for s, p, m, n in rows]

    def rollout_metrics(
        self, system_id: str, split: str, phase: str = "eval", *, samples: int | None = None
    ) -> dict[str, float]:
        """Means per stored rollout of the system on that split and phase (with ``samples``:
        sample indices below it only): ``cost`` (money), ``calls`` (LLM calls) and
        ``latency`` (seconds); empty when it has none."""
        with self._read() as c:
            n, cost, calls, latency = c.execute(
                "SELECT COUNT(*), AVG(cost), AVG(calls), AVG(duration) FROM trajectories "
                "WHERE system_id = ? AND split = ? AND phase = ? AND sample < ?",
                (system_id, split, phase, samples if samples is not None else 1 << 62),
            ).fetchone()
        return {} if not n else {"cost": float(cost), "calls": float(calls), "latency": float(latency)}

    def failure_stats(
        self,
        *,
        phase: str | None = "eval",
        system_id: str | None = None,
        other_than: str | None = None,
        split: str | None = None,
    ) -> tuple[int, list[str]]:
        """``(rollouts, failure messages)`` of the stored rollouts of one phase (None: all), of one
        system (or of every system but ``other_than``), on one split or all."""
        where, args = ["1 = 1"], []
        for cond, val in (
            ("t.phase = ?", phase),
            ("t.system_id = ?", system_id),
            ("t.system_id != ?", other_than),
            ("t.split = ?", split),
        ):
            if val is not None:
                where.append(cond)
                args.append(val)
        q = " AND ".join(where)
        with self._read() as c:
            n = int(c.execute(f"SELECT COUNT(*) FROM trajectories t WHERE {q}", tuple(args)).fetchone()[0])
            raw = c.execute(
                "SELECT d.enc, d.data FROM trajectories t JOIN trajectory_data d ON d.seq = t.seq "
                f"WHERE {q} AND (t.error = 1 OR t.reward_error = 1) ORDER BY t.seq",
                tuple(args),
            ).fetchall()
        msgs = []
        for enc, data in raw:
            t = Trajectory.model_validate_json(unpack(enc, data))
            msgs.append(t.error or (t.reward.error if t.reward is not None else "") or "")
        return n, msgs

    def rollout_counts(self) -> dict[tuple[str, str], dict[str, int]]:
        """``(split, phase) -> {rollouts, failed, reward_errors}`` over every stored rollout."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, phase, COUNT(*), SUM(error), SUM(reward_error) FROM trajectories GROUP BY split, phase"
            ).fetchall()
        return {
            (s, p): {"rollouts": int(n), "failed": int(e or 0), "reward_errors": int(r or 0)} for s, p, n, e, r in rows
        }

    def out_of_range(self, low: float, high: float) -> dict[str, dict[str, float]]:
        """``split -> {n, min, max}`` of the stored rollouts whose score lies outside [low, high]."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, COUNT(*), MIN(score), MAX(score) FROM trajectories "
                "WHERE score < ? OR score > ? GROUP BY split",
                (low, high),
            ).fetchall()
        return {s: {"n": int(n), "min": float(lo), "max": float(hi)} for s, n, lo, hi in rows}

    def max_calls(self) -> int:
        """The most LLM calls one stored trajectory made (0 when none is stored)."""
        with self._read() as c:
            return int(c.execute("SELECT COALESCE(MAX(calls), 0) FROM trajectories").fetchone()[0])

    def all_scores(self, split: str, phase: str = "eval") -> dict[str, tuple[float, int]]:
        """``system_id -> (mean score, n)`` for every system scored on that split and phase."""
        with self._read() as c:
            rows = c.execute(
                "SELECT system_id, AVG(score), COUNT(*) FROM trajectories WHERE split = ? AND phase = ? GROUP BY system_id",
                (split, phase),
            ).fetchall()
        return {s: (float(m), int(n)) for s, m, n in rows}

    def best(self, split: str = "val", phase: str = "eval") -> str | None:
        """The stored system with the highest mean score on ``split`` (ties: more samples,
        then the earlier system), or None when none is scored."""
        with self._read() as c:
            row = c.execute(
                "SELECT t.system_id FROM trajectories t JOIN systems s ON s.id = t.system_id "
                "WHERE t.split = ? AND t.phase = ? GROUP BY t.system_id "
                "ORDER BY AVG(t.score) DESC, COUNT(*) DESC, MIN(s.seq) ASC LIMIT 1",
                (split, phase),
            ).fetchone()
        return row[0] if row else None
