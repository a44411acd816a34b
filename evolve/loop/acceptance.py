"""Accepting and promoting children: two stages, and re-evaluation for noisy graders.

Stage 1: the child must beat its parent on this generation's training minibatch by more than
``engine.min_gain``. Stage 2: on validation it may be at most ``engine.val_tolerance`` worse
than its parent. An accepted child is promoted (made current) when it beats the best system.

With ``engine.reeval: {margin, samples}``, a val comparison closer than ``margin`` (child vs
parent at stage 2, or accepted child vs the best at promotion) is decided on means instead:
both systems get ``samples`` more samples of every val task (sample indices 1..samples, so
other seeds; memoised like every rollout, counted against the budget) and their means over
all samples are compared. The decision event records both means. A system's mean over all
samples is its score from then on (``state["reevaluated"]``).

``engine.acceptance: paired`` (:func:`paired_judge`, :func:`paired_promotion`) decides stage 2 and
the promotion on the paired comparison of the two systems' val scores, task by task, with its
interval (:func:`evolve.results.stats.paired`), instead of on a higher mean: a child joins the pool
unless it is worse than its parent beyond the interval (more than ``val_tolerance``), and becomes
the best only when its interval against the best lies wholly above zero. A gain that a val split of
this size cannot tell from noise is then never kept, which is what holds on test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from evolve.loop.selectors import Scored
from evolve.scoring.session import mean_score
from evolve.types import Candidate, System

if TYPE_CHECKING:
    from evolve.scoring.session import Session


@dataclass
class Verdict:
    accepted: bool
    score: float  # the child's val score (its mean over all samples when re-evaluated); nan at stage 1
    why: str
    reeval: list[dict[str, Any]] = field(default_factory=list)


def refine(session: Session, system: System, gen: int) -> float:
    """The system's val mean over ``1 + reeval.samples`` samples per task (memoised)."""
    reeval = session.task.engine.reeval
    assert reeval is not None  # called only when the task re-evaluates close calls
    n = 1 + reeval.samples
    trajs = session.rollouts(
        system,
        session.tasks("val"),
        split="val",
        tag="eval:val",
        generation=gen,
        samples=n,
        description=f"gen {gen}: re-evaluate {system.id[:8]} on val x{n}",
    )
    mean = mean_score(trajs)
    session.state.refine(system.id, mean, gen)
    return mean


def stage1(session: Session, gen: int, cand: Candidate, minibatch: list | None, p_mb: float) -> Verdict | str:
    """Stage 1 on the minibatch: the rejection, or the text the verdict starts with ("" when
    ``minibatch`` is None: ``acceptance: val_only``)."""
    if minibatch is None:
        return ""
    c_traj = session.rollouts(
        cand.system,
        minibatch,
        split="train",
        tag="eval:train",
        generation=gen,
        description=f"gen {gen}: child {cand.system.id[:8]} on minibatch",
    )
    c_mb = mean_score(c_traj)
    if not c_mb > p_mb + session.task.engine.min_gain:
        return Verdict(False, float("nan"), f"rejected at stage 1: minibatch {c_mb:.3f} vs parent {p_mb:.3f}")
    return f"minibatch {c_mb:.3f} vs {p_mb:.3f}, "


def judge(
    session: Session, gen: int, cand: Candidate, minibatch: list | None, parent: System, p_mb: float, p_val: float
) -> Verdict:
    """Stage 1 on the minibatch (skipped when ``minibatch`` is None: ``acceptance: val_only``), then
    stage 2 on validation (re-evaluated when close)."""
    cfg = session.task.engine
    first = stage1(session, gen, cand, minibatch, p_mb)
    if isinstance(first, Verdict):
        return first
    c_val, _ = session.evaluate(cand.system, "val", generation=gen)
    notes, how = [], "val"
    if cfg.reeval is not None and abs(c_val - p_val) <= cfg.reeval.margin:
        c_mean, p_mean = refine(session, cand.system, gen), refine(session, parent, gen)
        notes.append(
            {
                "against": "parent",
                "system": parent.id,
                "child_score": round(c_val, 6),
                "other_score": round(p_val, 6),
                "child_mean": round(c_mean, 6),
                "other_mean": round(p_mean, 6),
                "samples": 1 + cfg.reeval.samples,
            }
        )
        c_val, p_val, how = c_mean, p_mean, f"val mean of {1 + cfg.reeval.samples} samples"
    if c_val < p_val - cfg.val_tolerance:
        return Verdict(False, c_val, f"rejected at stage 2: {how} {c_val:.3f} vs parent {p_val:.3f}", notes)
    return Verdict(True, c_val, f"accepted: {first}{how} {c_val:.3f} vs {p_val:.3f}", notes)


def promotion(session: Session, gen: int, cand: Candidate, verdict: Verdict, best: Scored) -> tuple[bool, Scored]:
    """Whether the accepted child becomes the best system, and the best afterwards. A close
    call against the best is re-evaluated (both means; ``verdict`` gets the note and the
    child's mean as its score), and so is any comparison where one side's score is already a
    mean (a single lucky sample must not beat a mean)."""
    reeval = session.task.engine.reeval
    # like with like: once either score is a mean over samples, both are compared as means
    means = bool(verdict.reeval) or best.system_id in session.state.reevaluated()
    if (
        reeval is not None
        and best.system_id != cand.system.id
        and (means or abs(verdict.score - best.score) <= reeval.margin)
    ):
        first = verdict.score
        c_mean = refine(session, cand.system, gen)
        b_mean = refine(session, session.archive.get_system(best.system_id), gen)
        verdict.reeval.append(
            {
                "against": "best",
                "system": best.system_id,
                "child_score": round(first, 6),
                "other_score": round(best.score, 6),
                "child_mean": round(c_mean, 6),
                "other_mean": round(b_mean, 6),
                "samples": 1 + reeval.samples,
            }
        )
        verdict.score = c_mean
        best = Scored(best.system_id, b_mean, best.generation)
        promoted = c_mean > b_mean
        verdict.why += (
            f"; promoted (val mean {c_mean:.3f} vs best {b_mean:.3f})"
            if promoted
            else f"; not promoted (val mean {c_mean:.3f} vs best {b_mean:.3f})"
        )
    else:
        promoted = verdict.score > best.score
    return promoted, (Scored(cand.system.id, verdict.score, gen) if promoted else best)


def _paired_val(session: Session, gen: int, a: System, b: System, z: float) -> dict[str, Any]:
    """``b`` against ``a`` on the val tasks both were scored on (memoised rollouts), at ``z``."""
    from evolve.results.stats import paired

    session.evaluate(b, "val", generation=gen)
    c = paired(session.task_scores(a, "val"), session.task_scores(b, "val"))
    if c["ci95"] is not None and z != 1.96:  # the interval at another confidence: the same spread, rescaled
        half = c["ci95"] * z / 1.96
        c.update(ci95=half, low=max(-1.0, c["diff"] - half), high=min(1.0, c["diff"] + half))
    return c


def _shown(c: dict[str, Any]) -> str:
    if c["low"] is None:
        return f"{100 * (c['diff'] or 0):+.1f} points (n={c['n']}, no interval)"
    return f"{100 * c['diff']:+.1f} points [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] on {c['n']} val tasks"


def paired_judge(
    session: Session, gen: int, cand: Candidate, minibatch: list | None, parent: System, p_mb: float, z: float
) -> Verdict:
    """Stage 1 as ``two_stage``; stage 2 rejects a child whose paired val interval against its
    parent lies wholly below ``-val_tolerance``."""
    first = stage1(session, gen, cand, minibatch, p_mb)
    if isinstance(first, Verdict):
        return first
    c = _paired_val(session, gen, parent, cand.system, z)
    score = c["b"] if c["b"] is not None else 0.0
    note = {"against": "parent", "system": parent.id, "paired": {k: c[k] for k in ("n", "diff", "low", "high")}}
    upper = c["high"] if c["high"] is not None else c["diff"]
    if upper is None or upper < -session.task.engine.val_tolerance:
        return Verdict(False, score, f"rejected at stage 2: paired {_shown(c)} vs its parent", [note])
    return Verdict(True, score, f"accepted: {first}paired {_shown(c)} vs its parent", [note])


def paired_promotion(
    session: Session, gen: int, cand: Candidate, verdict: Verdict, best: Scored, z: float
) -> tuple[bool, Scored]:
    """The accepted child becomes the best only when its paired val interval against the best
    lies wholly above zero; the verdict says the interval either way."""
    if best.system_id == cand.system.id:
        return False, best
    c = _paired_val(session, gen, session.archive.get_system(best.system_id), cand.system, z)
    promoted = c["low"] is not None and c["low"] > 0
    verdict.reeval.append(
        {"against": "best", "system": best.system_id, "paired": {k: c[k] for k in ("n", "diff", "low", "high")}}
    )
    verdict.why += (
        f"; promoted (paired {_shown(c)} vs the best)"
        if promoted
        else f"; not promoted (paired {_shown(c)} vs the best: the interval is not above 0)"
    )
    return promoted, (Scored(cand.system.id, verdict.score, gen) if promoted else best)
