"""A curriculum that follows success (``engine.curriculum``), as WebRL's self-evolving curriculum
keeps its tasks at the edge of what the agent can do.

The training tasks fall into groups (``group_key``: a generator) and difficulty levels
(``level_key``: whole numbers, the lowest the easiest; a move goes to the next level the group
has). Each generation, before its minibatch is drawn, every group is judged on the rollouts the
run already stored: the parents' rollouts on the minibatches of the last ``window`` generations,
on that group's tasks at its current level (``n`` of them, ``solved`` at a score of ``solved_at``
or more). With ``evidence: all`` the operators' own samples from those parents on training tasks in
those generations count too (STaR's and GRPO's: hundreds of rollouts where the minibatch has a
handful a group). With at least ``min_samples`` of them:

* success above the band (``rate > high``): one level up; already at the hardest, the group is
  *mastered* and its weight is multiplied by ``off_band``;
* below the band (``rate < low``): one level down; already at the easiest, it is *too hard* and
  its weight is multiplied by ``off_band``;
* within the band: it holds, at full weight. With fewer rollouts it holds as it was.

A group's weight is its share of the training split (the task file's mix) times that factor; the
weights, normalised, are the generation's *mix*. The generation's training tasks (what the
operators see as ``ctx.train``: STaR's and GRPO's samples, the memory operator's extra tasks) are
each group's tasks at its level, in the mix; its minibatch (``engine.minibatch`` tasks) is drawn
in the mix too, from tasks no earlier minibatch held first (fresh), then the others. Validation
and test are never touched.

Everything is decided from the archive's scores and ``random.Random(f"{seed}/curriculum/{g}")``,
so the same seed with a deterministic model decides the same. Each decision is stored in the run
state (``curriculum/<g>``; a resumed generation reuses it), logged as a ``curriculum`` event, and
shown in ``report.json`` (``curriculum``) and ``report.md`` (:class:`CurriculumSection`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evolve.errors import ConfigError

if TYPE_CHECKING:
    from evolve.scoring.session import Session
    from evolve.task.config import CurriculumConfig


def shares(n: int, weights: list[float]) -> list[int]:
    """``n`` split by ``weights`` (largest remainder; ties to the earlier entry)."""
    total = sum(weights)
    if n <= 0 or total <= 0:
        return [0] * len(weights)
    raw = [n * w / total for w in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (out[i] - raw[i], i))[: n - sum(out)]:
        out[i] += 1
    return out


def judge(level: int, top: int, rate: float, band: tuple[float, float]) -> tuple[int, str]:
    """The band rule for one group: ``(its next level, what happened)``; what happened is ``up``,
    ``down``, ``in band``, ``mastered`` (above the band at the hardest level) or ``too hard``
    (below it at the easiest)."""
    low, high = band
    if rate > high:
        return (level + 1, "up") if level < top else (level, "mastered")
    if rate < low:
        return (level - 1, "down") if level > 0 else (level, "too hard")
    return level, "in band"


@dataclass
class Groups:
    """The training split by group and level."""

    tasks: dict[str, dict[int, list[dict]]] = field(default_factory=dict)  # group -> level -> tasks
    where: dict[str, tuple[str, int]] = field(default_factory=dict)  # task id -> (group, level)

    @classmethod
    def of(cls, train: list[dict], cfg: CurriculumConfig) -> Groups:
        out = cls()
        for t in train:
            group, level = t.get(cfg.group_key), t.get(cfg.level_key)
            if group is None or isinstance(level, bool) or not isinstance(level, int) or level < 0:
                raise ConfigError(
                    f"training task {t.get('id')!r} has no {cfg.group_key!r} (its group) or no whole "
                    f"{cfg.level_key!r} >= 0 (its difficulty level); the curriculum needs both on every "
                    "training task (world: reasoning_gym gives them); set engine.curriculum.group_key / "
                    "level_key to the fields your tasks have",
                    path="engine.curriculum",
                )
            out.tasks.setdefault(str(group), {}).setdefault(level, []).append(t)
            out.where[str(t["id"])] = (str(group), level)
        if not out.tasks:
            raise ConfigError("the curriculum has no training tasks to order", path="engine.curriculum")
        return out

    @property
    def names(self) -> list[str]:
        return sorted(self.tasks)

    def levels(self, group: str) -> list[int]:
        """The group's levels, easiest first."""
        return sorted(self.tasks[group])

    def base(self) -> dict[str, float]:
        """Each group's share of the training split: the task file's mix."""
        n = {g: sum(len(v) for v in self.tasks[g].values()) for g in self.names}
        return {g: n[g] / sum(n.values()) for g in self.names}


def decide(
    cfg: CurriculumConfig,
    groups: Groups,
    previous: dict[str, Any] | None,
    measured: dict[str, tuple[int, int]],
    generation: int,
) -> dict[str, Any]:
    """The decision of ``generation`` from the one before (None: the start) and what was measured
    (``group -> (rollouts, solved)`` at its current level): levels, weight factors, mix, moves."""
    levels, factors, moves, success = {}, {}, {}, {}
    for g in groups.names:
        known = groups.levels(g)
        if previous is None:
            levels[g], factors[g], moves[g] = known[min(cfg.start, len(known) - 1)], 1.0, "start"
            continue
        level, factor = int(previous["levels"][g]), float(previous["factors"][g])
        n, solved = measured.get(g, (0, 0))
        success[g] = {"n": n, "solved": solved, "level": level}
        if n < cfg.min_samples:
            levels[g], factors[g], moves[g] = level, factor, "hold (few rollouts)"
            continue
        rank, what = judge(known.index(level), len(known) - 1, solved / n, cfg.band)
        levels[g], moves[g] = known[rank], what
        factors[g] = cfg.off_band if what in ("mastered", "too hard") else 1.0
    base = groups.base()
    weights = {g: base[g] * factors[g] for g in groups.names}
    mix = {g: w / sum(weights.values()) for g, w in weights.items()}
    return {
        "generation": generation,
        "levels": levels,
        "factors": factors,
        "mix": mix,
        "moves": moves,
        "success": success,
        "band": list(cfg.band),
    }


class Curriculum:
    """Built once per run (``engine.curriculum`` and the training split); :meth:`step` gives each
    generation its training tasks and minibatch."""

    def __init__(self, cfg: CurriculumConfig, train: list[dict]) -> None:
        self.cfg, self.groups = cfg, Groups.of(train, cfg)

    def measure(self, session: Session, generation: int, levels: dict[str, int]) -> dict[str, tuple[int, int]]:
        """``group -> (rollouts, solved)``: the parents' stored minibatch rollouts of the last
        ``window`` generations (with ``evidence: all``, also the operators' samples from those parents
        on training tasks in those generations), on tasks at the group's current level."""
        keys, parents, gens = [], [], []
        for g in range(max(1, generation - self.cfg.window), generation):
            d = session.state.curriculum(g)
            if d is not None:
                keys += [f"eval:train/{pid}/{tid}/0" for pid in d["parents"] for tid in d["minibatch"]]
                parents += d["parents"]
                gens.append(g)
        rows = session.archive.outcomes(
            keys=keys, system_ids=parents, generations=gens, explore=self.cfg.evidence == "all"
        )
        out: dict[str, list[int]] = {}
        for task_id, score, failed in rows.values():
            group, level = self.groups.where.get(str(task_id), (None, None))
            if group is None or level != levels[group]:
                continue
            row = out.setdefault(group, [0, 0])
            row[0] += 1
            row[1] += int(not failed and score >= self.cfg.solved_at)
        return {g: (n, s) for g, (n, s) in out.items()}

    def draw(
        self, decision: dict[str, Any], used: set[str], n: int, rng: random.Random
    ) -> tuple[list[dict], list[dict]]:
        """The generation's training tasks and minibatch for ``decision`` (see the module docstring)."""
        names = self.groups.names
        mix = [max(float(decision["mix"][g]), 1e-9) for g in names]
        avail = [self.groups.tasks[g][int(decision["levels"][g])] for g in names]
        # the largest pool in the mix that every group can fill
        size = min(int(len(a) / m) for a, m in zip(avail, mix))
        pool_n = [min(len(a), k) for a, k in zip(avail, shares(size, mix))]
        batch_n = [min(len(a), k) for a, k in zip(avail, shares(n, mix))]
        pool, batch = [], []
        for tasks, k_pool, k_batch in zip(avail, pool_n, batch_n):
            fresh = [t for t in tasks if str(t["id"]) not in used]
            seen = [t for t in tasks if str(t["id"]) in used]
            rng.shuffle(fresh)
            rng.shuffle(seen)
            order = fresh + seen
            batch += order[:k_batch]
            pool += order[: max(k_pool, k_batch)]
        return pool, batch

    def step(self, session: Session, generation: int, parents: list[str], n: int) -> tuple[list[dict], list[dict]]:
        """``(the generation's training tasks, its minibatch)``, deciding first unless this generation
        was decided before (a resumed run)."""
        earlier = [d for d in session.state.curricula() if int(d["generation"]) < generation]
        used = {tid for d in earlier for tid in d["minibatch"]}
        saved = session.state.curriculum(generation)
        rng = session.rng(f"curriculum/{generation}")
        if saved is not None:
            return self.draw(saved, used, n, rng)
        previous = earlier[-1] if earlier else None
        measured = self.measure(session, generation, previous["levels"]) if previous else {}
        decision = decide(self.cfg, self.groups, previous, measured, generation)
        pool, batch = self.draw(decision, used, n, rng)
        decision.update(
            {
                "parents": list(parents),
                "minibatch": [str(t["id"]) for t in batch],
                "fresh": sum(str(t["id"]) not in used for t in batch),
                "pool": {g: sum(1 for t in pool if self.groups.where[str(t["id"])][0] == g) for g in self.groups.names},
            }
        )
        session.state.save_curriculum(generation, decision)
        session.archive.log_event(
            "curriculum", {k: decision[k] for k in ("generation", "levels", "moves", "mix", "success")}
        )
        session.obs.message(
            f"gen {generation}: curriculum "
            + ", ".join(
                f"{g} L{decision['levels'][g]} {decision['moves'][g]} ({100 * decision['mix'][g]:.0f}%)"
                for g in self.groups.names
            )
        )
        return pool, batch


def decision_rows(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each generation's decision as the report and the dashboard show it: its levels, factors, mix,
    moves and the success counts that decided them (``success``: ``group -> {n, solved, level}``),
    the minibatch as its size."""
    return [
        {
            **{k: v for k, v in d.items() if k not in ("minibatch", "parents")},
            "minibatch": len(d.get("minibatch") or ()),
        }
        for d in decisions
    ]


class CurriculumSection:
    """What the curriculum adds to ``report.json`` (``curriculum``) and ``report.md``; nothing to
    ``evolve archive show`` (a run's curriculum is not a system's)."""

    def build(self, session: Session, best_id: str | None, baseline_id: str | None) -> dict[str, Any]:
        decisions = session.state.curricula()
        if not decisions:
            return {}
        cfg = session.task.engine.curriculum
        rows = decision_rows(decisions)
        return {
            "curriculum": {"settings": cfg.model_dump(mode="json") if cfg is not None else None, "generations": rows}
        }

    def markdown(self, report: dict[str, Any]) -> list[str]:
        c = report.get("curriculum")
        if not c or not c.get("generations"):
            return []
        rows = c["generations"]
        groups = sorted(rows[0]["levels"])
        lo, hi = rows[0].get("band", [0, 1])
        evidence = (
            "the parents' minibatch rollouts and the operators' samples from them"
            if (c.get("settings") or {}).get("evidence") == "all"
            else "the parents' minibatch rollouts"
        )
        lines = [
            "",
            f"## Curriculum (kept in a success band of {100 * lo:.0f}-{100 * hi:.0f}%)",
            "",
            "Each cell: the level (0 the easiest) and the share of the generation's training tasks, what "
            f"moved it, and the success it was decided on ({evidence} at the level before).",
            "",
            "| gen | " + " | ".join(groups) + " | minibatch (fresh) |",
            "|---|" + "---|" * (len(groups) + 1),
        ]
        for r in rows:
            cells = []
            for g in groups:
                s = (r.get("success") or {}).get(g)
                seen = f"; {s['solved']}/{s['n']} at L{s['level']}" if s and s.get("n") else ""
                cells.append(f"L{r['levels'][g]}, {100 * r['mix'][g]:.0f}% ({r['moves'][g]}{seen})")
            lines.append(f"| {r['generation']} | " + " | ".join(cells) + f" | {r['minibatch']} ({r.get('fresh', 0)}) |")
        return lines

    def prepare(self, system: Any, png: Any) -> None:
        return None

    def show(self, out: Any, err: Any, sid: str) -> None:
        return None


__all__ = ["Curriculum", "CurriculumSection", "Groups", "decide", "decision_rows", "judge", "shares"]
