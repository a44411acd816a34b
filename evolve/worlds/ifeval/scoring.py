"""IFEval's four figures from scored prompts, and the model cards' scores to set them beside.

From the rewards' components (:mod:`evolve.worlds.ifeval.reward`) of a set of prompts:

* prompt-level strict / loose accuracy: the share of prompts whose every instruction is followed;
* instruction-level strict / loose accuracy: the share of all instructions followed (pooled over
  prompts, as the reference computes it);
* the strict and loose averages of the two levels, what the SmolLM2 model cards report as "IFEval
  (average prompt/inst)", with a 95% percentile-bootstrap interval over prompts (2,000 resamples,
  seeded, so a summary is the same on every reading);
* per instruction type, the strict share followed;
* the share of replies that repeat the whole prompt: the prompt repeated back scores
  :data:`ECHO_FLOOR` on the strict average, above SmolLM2-135M's card, so a figure above the card
  means little until this share is read beside it.

:func:`summary` is the world's ``eval.summary`` hook: ``evolve eval`` prints its lines and the run
report adds them for the baseline and the best system.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# "IFEval (average prompt/inst)" on the SmolLM2 model cards (lighteval: chat template, greedy, 1,280 new
# tokens, bf16 weights; the cards do not say strict or loose)
CARDS = {"SmolLM2-135M-Instruct": 29.9, "SmolLM2-360M-Instruct": 41.0, "SmolLM2-1.7B-Instruct": 56.7}
ECHO_FLOOR = 30.4  # IFEval's strict average when every reply is the prompt itself (bench/worlds/ifeval_floors.py)
FIGURES = ("prompt_strict", "inst_strict", "prompt_loose", "inst_loose", "strict", "loose")
RESAMPLES = 2000
COLUMNS = ("instructions", "strict", "loose", "prompt_strict", "prompt_loose")  # a prompt's components, summed


def _figures(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    n = len(rows)
    inst = sum(r["instructions"] for r in rows)
    f = {
        "prompt_strict": sum(r["prompt_strict"] for r in rows) / n,
        "prompt_loose": sum(r["prompt_loose"] for r in rows) / n,
        "inst_strict": sum(r["strict"] for r in rows) / inst if inst else 0.0,
        "inst_loose": sum(r["loose"] for r in rows) / inst if inst else 0.0,
    }
    f["strict"] = (f["prompt_strict"] + f["inst_strict"]) / 2
    f["loose"] = (f["prompt_loose"] + f["inst_loose"]) / 2
    return f


def _bootstrap(rows: Sequence[Mapping[str, float]], seed: int = 0) -> dict[str, tuple[float, float]]:
    import numpy as np

    m = _matrix(rows)
    idx = np.random.default_rng(seed).integers(0, len(rows), size=(RESAMPLES, len(rows)))
    strict, loose = _averages(m[idx].sum(axis=1), len(rows))  # each (resamples,)
    return {
        k: (float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5)))
        for k, v in (("strict", strict), ("loose", loose))
    }


def _matrix(rows: Sequence[Mapping[str, float]]) -> Any:
    """The prompts' components as rows of :data:`COLUMNS`."""
    import numpy as np

    return np.array([[r[c] for c in COLUMNS] for r in rows], dtype=float)


def _averages(s: Any, n: int) -> tuple[Any, Any]:
    """Strict and loose averages of :data:`COLUMNS` sums ``s`` over ``n`` prompts."""
    import numpy as np

    inst = np.maximum(s[..., 0], 1.0)
    return (s[..., 3] / n + s[..., 1] / inst) / 2, (s[..., 4] / n + s[..., 2] / inst) / 2


def paired(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]], seed: int = 0) -> dict[str, Any]:
    """System B against system A on the same prompts (``a[i]`` and ``b[i]``: the reward components
    of one prompt): the strict and loose averages' differences B - A with a 95% paired bootstrap
    interval (the prompts resampled together), and how many prompts each wins on strict verdicts."""
    import numpy as np

    if len(a) != len(b) or not a:
        raise ValueError(f"paired figures need the same prompts scored by both systems; got {len(a)} and {len(b)}")
    ma, mb = _matrix(a), _matrix(b)
    n = len(a)
    idx = np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))
    da = _averages(ma[idx].sum(axis=1), n)
    db = _averages(mb[idx].sum(axis=1), n)
    point_a, point_b = _figures(a), _figures(b)
    out: dict[str, Any] = {"n": n}
    for i, k in enumerate(("strict", "loose")):
        diff = db[i] - da[i]
        out[k] = {
            "difference": point_b[k] - point_a[k],
            "interval": (float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))),
        }
    share_a, share_b = ma[:, 1] / np.maximum(ma[:, 0], 1), mb[:, 1] / np.maximum(mb[:, 0], 1)
    out["b_better"], out["a_better"] = int((share_b > share_a).sum()), int((share_a > share_b).sum())
    return out


def summary(tasks: Sequence[Mapping[str, Any]], rewards: Sequence[Any]) -> dict[str, Any]:
    """The figures of the scored prompts: ``tasks[i]`` scored ``rewards[i]`` (a
    :class:`~evolve.types.Reward`, or None for a rollout that failed before its reward, which then
    follows no instruction, as an empty reply). Returns ``{"n", "figures", "intervals", "by_type",
    "lines"}``."""
    from evolve.worlds.ifeval.reward import reward as score

    rows = []
    for task, r in zip(tasks, rewards):
        comps = getattr(r, "components", None) or {}
        rows.append(comps if "instructions" in comps else score(task, "").components)
    if not rows:
        return {"n": 0, "figures": {}, "intervals": {}, "by_type": {}, "lines": ["IFEval: no prompt scored"]}
    fig = _figures(rows)
    ci = _bootstrap(rows)
    by_type: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("n:"):
                t = by_type.setdefault(k[2:], [0.0, 0.0])
                t[0] += r.get(f"strict:{k[2:]}", 0.0)
                t[1] += v
    types = {k: v[0] / v[1] for k, v in sorted(by_type.items()) if v[1]}
    echo = sum(r.get("echo", 0.0) for r in rows) / len(rows)
    return {
        "n": len(rows),
        "figures": fig,
        "intervals": ci,
        "by_type": types,
        "echo": echo,
        "lines": [
            *lines(fig, ci, len(rows), cards=all("key" in t for t in tasks)),
            f"  replies that repeat the whole prompt: {100 * echo:.1f}% (the prompt "
            f"alone scores {ECHO_FLOOR} strict on IFEval: bench/worlds/ifeval_floors.py)",
        ],
    }


def lines(fig: Mapping[str, float], ci: Mapping[str, tuple[float, float]], n: int, cards: bool = True) -> list[str]:
    """The figures as text lines, the cards' scores beside them when the prompts are the file's
    (``cards``); generated prompts (train, val, unseen) say that the cards do not compare."""
    pct = {k: 100 * v for k, v in fig.items()}
    out = [
        f"IFEval figures on {n} prompts:",
        f"  prompt-level strict {pct['prompt_strict']:.1f}  instruction-level strict {pct['inst_strict']:.1f}  "
        f"average {pct['strict']:.1f} [{100 * ci['strict'][0]:.1f}, {100 * ci['strict'][1]:.1f}]",
        f"  prompt-level loose  {pct['prompt_loose']:.1f}  instruction-level loose  {pct['inst_loose']:.1f}  "
        f"average {pct['loose']:.1f} [{100 * ci['loose'][0]:.1f}, {100 * ci['loose'][1]:.1f}]",
        "  model cards (average prompt/inst, lighteval, bf16): " + ", ".join(f"{k} {v:.1f}" for k, v in CARDS.items())
        if cards
        else "  generated prompts: the model cards' scores are on IFEval's 541 and do not compare",
    ]
    return out


__all__ = ["CARDS", "FIGURES", "lines", "paired", "summary"]
