"""Gates a candidate must pass before it serves anyone.

* **Regression**: the candidate and the active system are scored on the same tasks with the pinned
  reward; the gate passes when the one-sided lower confidence bound of the mean paired difference
  (candidate - active) at the stated ``risk`` is at least ``-margin``, on at least ``min_tasks``
  tasks. So a candidate worse by more than the margin passes with probability at most ``risk``
  (normal approximation of the paired mean).
* **Guards**: suites that must keep a floor (a mean score) or a ceiling (the 95th percentile of
  rollout time, the mean cost or tokens of a rollout) whatever the average does: the
  misevolution case, a version that gains reward while it loses a behaviour that mattered.

A failure says which suite, by how much, and on which tasks. Rollouts are memoised in the archive
under a tag that carries the pins' id, so a re-pinned reward scores anew.

**The gate split.** A suite gates by default on tasks selection never saw: when a run whose policy
gates on ``tasks: gate`` starts, :func:`hold_out_gate` takes ``deploy.gate_share`` of its val
split, chosen by a hash of the run's seed and each task's id, out of val (and a train task equal
to one of them out of train) before anything is scored, and records their ids (run state
``deploy.gate``), so every later session of the run (its resumption, ``evolve promote``,
``evolve eval``) sees the same three disjoint splits. A dataset source that returns a ``gate``
split gives it instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

from evolve.errors import ConfigError
from evolve.scoring.holdout import GATE_KEY, carve, choose_gate, hold_out_gate
from evolve.types import System, Trajectory

SPLITS = ("train", "val", "test", "gate")


@dataclass
class SuiteResult:
    name: str
    kind: str  # regression | guard
    passed: bool
    n: int
    candidate: float | None
    active: float | None = None
    diff: float | None = None
    lower: float | None = None
    checks: dict[str, Any] = field(default_factory=dict)
    worse_tasks: list[str] = field(default_factory=list)
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        """As JSON (an audit event's evidence): a bound that does not exist is None."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


def _suites(dep: Any) -> list[Any]:
    return ([dep.regression] if dep.regression else []) + list(dep.guards)


def run_splits(cfg: Any, base_dir: Path, archive: Any) -> dict[str, list[dict]]:
    """A run's splits as its sessions see them (the gate split held out, if it has one)."""
    from evolve.task.data import load_splits

    splits = load_splits(cfg.dataset, base_dir, cfg.seed)
    saved = archive.get_state(GATE_KEY)
    return carve(splits, saved["ids"]) if saved is not None else splits


def split_tasks(cfg: Any, splits: dict[str, list[dict]]) -> Callable[[str], list[dict]]:
    """``split -> tasks`` as a session gives them (``engine.val_size`` / ``test_size`` applied)."""

    def tasks(split: str) -> list[dict]:
        limit = {"val": cfg.engine.val_size, "test": cfg.engine.test_size}.get(split)
        return list(splits.get(split, [])[:limit] if limit else splits.get(split, []))

    return tasks


def suite_tasks(suite: Any, tasks_of: Callable[[str], list[dict]], base_dir: Path, has: Any = None) -> list[dict]:
    """The tasks ``suite`` scores on: a split (``tasks_of(split)``) or its JSONL file."""
    if suite.tasks in SPLITS:
        if suite.tasks == "gate" and has is not None and "gate" not in has:
            raise ConfigError(
                f"suite {suite.name!r} gates on the gate split, and this run has none: it scored tasks "
                "before its deploy: policy gated on the gate split, so its selection saw every task. "
                "Give the suite a JSONL file of tasks the run never saw (tasks: FILE.jsonl), or "
                "tasks: test",
                path=f"deploy.{suite.name}.tasks",
            )
        tasks = tasks_of(suite.tasks)
    else:
        path = (base_dir / suite.tasks).resolve()
        if not path.is_file():
            raise ConfigError(
                f"suite {suite.name!r}: no task file {path}; give a JSONL file of tasks or a split "
                f"({', '.join(SPLITS)})",
                path=f"deploy.{suite.name}.tasks",
            )
        tasks = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    t = json.loads(line)
                except ValueError as e:
                    raise ConfigError(
                        f"suite {suite.name!r}: line {i + 1} of {path} is not JSON ({e})",
                        path=f"deploy.{suite.name}.tasks",
                    ) from None
                if not isinstance(t, dict):
                    raise ConfigError(
                        f"suite {suite.name!r}: line {i + 1} of {path} is not a JSON object",
                        path=f"deploy.{suite.name}.tasks",
                    )
                tasks.append({"id": f"{suite.name}-{i}", **t})
    tasks = tasks[: suite.limit] if suite.limit else tasks
    if not tasks:
        raise ConfigError(f"suite {suite.name!r} has no tasks", path=f"deploy.{suite.name}.tasks")
    return tasks


def split_files(cfg: Any, base_dir: Path) -> list[str]:
    """The dataset files whose tasks a suite on a split scores (the gate split is carved from val):
    the evaluation's files as much as a suite's own task file."""
    from_file = {"gate": "val", "val": "val", "test": "test", "train": "train"}
    out = set()
    for suite in _suites(cfg.deploy):
        rel = getattr(cfg.dataset, from_file[suite.tasks], None) if suite.tasks in SPLITS else None
        if rel:
            out.add(str((base_dir / rel).resolve()))
    return sorted(out)


def all_suite_tasks(cfg: Any, base_dir: Path, splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each suite's name -> the tasks it scores on, as the gates will (``splits``: the run's)."""
    return {s.name: suite_tasks(s, split_tasks(cfg, splits), base_dir, has=splits) for s in _suites(cfg.deploy)}


def _by_task(trajs: list[Trajectory]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for t in trajs:
        by.setdefault(str(t.task_id), []).append(t.score)
    return {k: sum(v) / len(v) for k, v in by.items()}


def _pct(a: float | None) -> str:
    return "n/a" if a is None else f"{100 * a:.1f}%"


def regression(suite: Any, cand: list[Trajectory], active: list[Trajectory]) -> SuiteResult:
    a, c = _by_task(active), _by_task(cand)
    common = [k for k in c if k in a]
    n = len(common)
    d = [c[k] - a[k] for k in common]
    mean = sum(d) / n if n else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    lower = mean - NormalDist().inv_cdf(1 - suite.risk) * sd / math.sqrt(n) if n else -math.inf
    worse = sorted((k for k in common if c[k] < a[k]), key=lambda k: (c[k] - a[k], k))
    cm = sum(c[k] for k in common) / n if n else None
    am = sum(a[k] for k in common) / n if n else None
    res = SuiteResult(
        suite.name,
        "regression",
        passed=n >= suite.min_tasks and lower >= -suite.margin,
        n=n,
        candidate=cm,
        active=am,
        diff=mean,
        lower=lower,
        worse_tasks=worse[:50],
        checks={
            "risk": suite.risk,
            "margin": suite.margin,
            "min_tasks": suite.min_tasks,
            "better": sum(1 for x in d if x > 0),
            "worse": len(worse),
        },
    )
    if n < suite.min_tasks:
        res.message = (
            f"{suite.name}: decided on {n} tasks, fewer than min_tasks={suite.min_tasks}; give the suite "
            "more tasks"
            + (
                " (the gate split holds deploy.gate_share of the val tasks, chosen when the "
                "run starts; or give the suite a task file)"
                if suite.tasks == "gate"
                else ""
            )
        )
    else:
        verdict = "passes" if res.passed else "fails"
        res.message = (
            f"{suite.name} {verdict}: the candidate scores {_pct(cm)} against the active system's "
            f"{_pct(am)} on {n} tasks ({100 * mean:+.1f} points; at risk {suite.risk:g} it may be "
            f"{100 * lower:+.1f}, {'within' if res.passed else 'beyond'} the margin "
            f"-{100 * suite.margin:.1f}); worse on {len(worse)} task(s)"
            + (": " + ", ".join(worse[:8]) + (" ..." if len(worse) > 8 else "") if worse else "")
        )
    return res


def guard(suite: Any, cand: list[Trajectory]) -> SuiteResult:
    by = _by_task(cand)
    n = len(by)
    mean = sum(by.values()) / n if n else None
    checks: dict[str, Any] = {}
    failed: list[str] = []
    if suite.floor is not None:
        ok = mean is not None and mean >= suite.floor
        checks["floor"] = {"limit": suite.floor, "value": mean, "passed": ok}
        if not ok:
            below = sorted(k for k, v in by.items() if v < 1.0)
            failed.append(
                f"mean score {_pct(mean)} is below the floor {_pct(suite.floor)} (short by "
                f"{100 * (suite.floor - (mean or 0)):.1f} points); failing tasks: "
                + ", ".join(below[:8])
                + (" ..." if len(below) > 8 else "")
            )
    durations = sorted(t.duration for t in cand)
    for key, limit, value, unit in (
        (
            "max_p95_seconds",
            suite.max_p95_seconds,
            durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)] if durations else None,
            "s",
        ),
        ("max_cost", suite.max_cost, sum(t.cost for t in cand) / len(cand) if cand else None, " USD"),
        ("max_tokens", suite.max_tokens, sum(t.tokens for t in cand) / len(cand) if cand else None, " tokens"),
    ):
        if limit is None:
            continue
        ok = value is not None and value <= limit
        checks[key] = {"limit": limit, "value": value, "passed": ok}
        if not ok:
            failed.append(
                f"{key.removeprefix('max_').replace('_', ' ')} {value:.4g}{unit} is above the ceiling {limit:g}{unit}"
            )
    res = SuiteResult(
        suite.name,
        "guard",
        passed=not failed,
        n=n,
        candidate=mean,
        checks=checks,
        worse_tasks=sorted(k for k, v in by.items() if v < 1.0)[:50],
    )
    res.message = f"{suite.name} {'passes' if not failed else 'fails'}: " + (
        "; ".join(failed) if failed else f"mean {_pct(mean)} on {n} tasks"
    )
    return res


def _no_world_failures(name: str, trajs: list[Trajectory]) -> None:
    """A gate is decided on the agent's behaviour only: rollouts the world failed under stop it."""
    from evolve.errors import InfraError

    bad = [t for t in trajs if t.infra is not None]
    if bad:
        raise InfraError(
            f"gate {name}: the world failed under {len(bad)} of {len(trajs)} rollouts "
            f"({bad[0].error}); nothing was decided, run evolve promote again"
        )


def run_gates(
    cfg: Any,
    base_dir: Path,
    run_dir: Path,
    candidate: System,
    active: System | None,
    pins: dict[str, Any],
    pins_id: str,
    observer: Any = None,
) -> tuple[list[SuiteResult], list[str]]:
    """Score ``candidate`` (and ``active`` for the regression suite) on the deploy policy's suites,
    running the pinned code from source. Returns the results and the files in the project's folders
    that the rollouts read and the pins do not hold."""
    from evolve.deploy.pins import from_source, unpinned_reads, watching
    from evolve.scoring.session import Session

    dep = cfg.deploy
    out: list[SuiteResult] = []
    seen: list[str] = []
    with from_source(pins):
        for suite in _suites(dep):
            session = Session(
                cfg,
                base_dir=base_dir,
                run_dir=run_dir,
                resume=True,
                evaluating=True,
                observer=observer,
                reward=suite.reward or None,
                budgeted=False,
            )
            try:
                tasks = suite_tasks(suite, session.tasks, base_dir, has=session.splits)
                split = suite.tasks if suite.tasks in SPLITS else "gate"
                tag = f"gate:{suite.name}:{pins_id}"
                with session.outside_budget(), watching() as reads:
                    cand = session.rollouts(
                        candidate, tasks, split=split, tag=tag, description=f"gate {suite.name} {candidate.id[:8]}"
                    )
                    _no_world_failures(suite.name, cand)
                    if suite is dep.regression:
                        if active is None:
                            raise ConfigError(
                                "the regression gate compares with the active system, and this run has none yet",
                                path="deploy.regression",
                            )
                        act = session.rollouts(
                            active,
                            tasks,
                            split=split,
                            tag=tag,
                            description=f"gate {suite.name} {active.id[:8]} (active)",
                        )
                        _no_world_failures(suite.name, act)
                        out.append(regression(suite, cand, act))
                    else:
                        out.append(guard(suite, cand))
                seen += reads
            finally:
                session.close()
    return out, unpinned_reads(pins, seen, run_dir)


__all__ = [
    "SuiteResult",
    "all_suite_tasks",
    "carve",
    "choose_gate",
    "guard",
    "hold_out_gate",
    "regression",
    "run_gates",
    "run_splits",
    "suite_tasks",
]
