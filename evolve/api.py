"""The Python API: the same engine as the CLI, in a few lines.

import evolve
report = evolve.run("examples/sql_agent/task.yaml", overrides=["budget.generations=1"])
app = evolve.load(report["run_dir"])          # the promoted system, ready to run
out = app.run({"id": "q1", ...})              # one rollout of your agent under it
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import RunDirError, UserError
from evolve.types import System, Trajectory

if TYPE_CHECKING:
    from evolve.results.report import RunReport


def run_task(
    task: str | Path | dict,
    *,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    resume: bool = False,
    fresh: bool = False,
    observer: Any = None,
    agent: Callable | None = None,
    reward: Callable | None = None,
    base_dir: str | Path | None = None,
) -> RunReport:
    """Run an evolution job from a task file, or from a dict with the same fields (whose
    ``agent`` and ``reward`` may be the functions themselves); return the report
    (:class:`~evolve.results.report.RunReport`: ``report.best.test.score``, ``report.gain("test")``, or
    ``report["best"]["test"]["score"]`` as in report.json).

    ``agent=`` / ``reward=`` give the functions for a task that names them by import path or
    leaves them out. ``resume`` continues the run in ``out``; ``fresh`` starts it over (the earlier
    run is moved aside, never deleted). Raises :class:`~evolve.errors.InfraError` when the world
    kept failing under the rollouts (``resume`` continues once it is back) and
    :class:`~evolve.errors.RunFailed` when too many rollouts failed by the agent's own error."""
    from evolve._env import quiet_defaults
    from evolve.loop.engine import Engine
    from evolve.task.taskfile import read_task_file, run_dir_for, validate_task

    quiet_defaults()
    if isinstance(task, dict):
        data, source, base = dict(task), "task", Path(base_dir or Path.cwd()).resolve()
    else:
        data, source, base = read_task_file(task), str(task), Path(task).parent.resolve()
    agent, reward = _callables(data, agent, reward)
    cfg = validate_task(data, overrides, source=source)
    run_dir = Path(out) if out is not None else run_dir_for(cfg, base)
    engine = Engine(
        cfg, base_dir=base, run_dir=run_dir, resume=resume, fresh=fresh, observer=observer, agent=agent, reward=reward
    )
    try:
        return engine.run()
    finally:  # the run's writer lets go: its -wal folds into the archive now, not when collected
        engine.archive.close()


def _callables(data: dict, agent: Callable | None, reward: Callable | None) -> tuple[Callable | None, Callable | None]:
    """Take function values of ``agent``/``reward`` out of a task dict (the config keeps their
    names: ``module:qualname``, which is what a resumed run is compared by); fill in the names of
    ``agent=``/``reward=`` functions the dict leaves out."""
    out = []
    for field, given in (("agent", agent), ("reward", reward)):
        value = data.get(field)
        if callable(value) and not isinstance(value, str):
            if given is not None and given is not value:
                raise UserError(f"the task gives {field} twice: as a function in the task and as {field}=; keep one")
            given = value
        if given is not None and (value is None or callable(value)):
            data[field] = function_name(given)
        out.append(given)
    return out[0], out[1]


def function_name(fn: Callable) -> str:
    """``module:qualname`` of a function (what a run records of an agent or reward given as one)."""
    return f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', None) or type(fn).__name__}"


def dry_run(
    task: str | Path | dict, *, overrides: Sequence[str] = (), base_dir: str | Path | None = None
) -> dict[str, Any]:
    """What a run of ``task`` would spend (rollouts, LLM calls, tokens, money per phase, and where
    a budget would stop it), without running anything; see :mod:`evolve.scoring.estimate`."""
    from evolve._env import quiet_defaults
    from evolve.scoring.estimate import estimate_run
    from evolve.task.taskfile import load_task, validate_task

    quiet_defaults()
    if isinstance(task, dict):
        cfg, base = validate_task(task, overrides), Path(base_dir or Path.cwd()).resolve()
    else:
        cfg, base = load_task(task, overrides)
    return estimate_run(cfg, base)


def _resolve_system(archive: Any, which: str) -> str:
    """An id prefix, or current / best / baseline (see :meth:`evolve.archive.Archive.resolve`)."""
    return archive.resolve(which)


def evaluate(
    task_file: str | Path,
    run_dir: str | Path,
    *,
    system: str = "current",
    split: str = "test",
    overrides: Sequence[str] = (),
    observer: Any = None,
) -> tuple[float, int, str]:
    """Score an archived system on a split of the task's dataset: ``(mean score, n, system id)``."""
    e = evaluation(task_file, run_dir, system=system, split=split, overrides=overrides, observer=observer)
    return e["score"], e["n"], e["system_id"]


def evaluation(
    task_file: str | Path,
    run_dir: str | Path,
    *,
    system: str = "current",
    split: str = "test",
    overrides: Sequence[str] = (),
    observer: Any = None,
) -> dict[str, Any]:
    """Score an archived system on a split: ``{"score", "n", "system_id", "summary"}``, the summary
    being the world's own figures (its ``eval.summary`` hook, e.g. IFEval's four accuracies) or None."""
    from evolve.results.world import world_summary
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    cfg, base = load_task(task_file, overrides)
    if not (Path(run_dir) / "archive.sqlite").exists():
        raise RunDirError(f"{run_dir} is not an evolvekit run directory (no archive.sqlite)")
    session = Session(cfg, base_dir=base, run_dir=Path(run_dir), resume=True, observer=observer, evaluating=True)
    try:
        if not session.tasks(split):
            raise UserError(
                f"the dataset has no {split!r} split; choose one of {sorted(k for k, v in session.splits.items() if v)}"
            )
        sid = _resolve_system(session.archive, system)
        with session.outside_budget():  # scoring after the run, like the report's
            chosen = session.archive.get_system(sid)
            score, n = session.evaluate(chosen, split)
            summary = world_summary(session, chosen, split)
    finally:
        session.close()
    return {"score": score, "n": n, "system_id": sid, "summary": summary}


class LoadedSystem:
    """An archived system ready to run inside an app: ``run(task)`` does one rollout."""

    def __init__(
        self,
        system: System,
        artifacts_root: Path,
        agent: str | Callable | None,
        reward: str | Callable | None = None,
        search_path: str | None = None,
    ) -> None:
        from evolve.runners import Worker, WorkerSpec

        self.system = system
        self._agent = agent
        self._spec = WorkerSpec(
            agent=agent or _no_agent,
            reward=reward or _no_reward,
            artifacts_root=str(artifacts_root),
            search_path=search_path,
        )
        self._worker = Worker(self._spec)

    @property
    def id(self) -> str:
        return self.system.id

    def llm(self, role: str = "policy") -> Any:
        """The system's model for ``role`` (weights and adapter loaded)."""
        return self._worker.llm(self.system, role)

    def rollout(self, task: dict, *, temperature: float | None = None, timeout: float | None = None) -> Trajectory:
        from evolve.runners import RolloutJob

        return self._worker.execute(
            RolloutJob(key="app", system=self.system, task=task, temperature=temperature, timeout=timeout)
        )

    def run(self, task: dict, **kw: Any) -> Any:
        """Run the agent on ``task`` and return its output. Raises RuntimeError with the agent's error
        when it failed, :class:`~evolve.errors.InfraError` when the world failed under it."""
        traj = self.rollout(task, **kw)
        if traj.infra is not None:
            from evolve.errors import InfraError

            raise InfraError(f"the world failed under the rollout ({traj.infra.category}): {traj.infra.message}")
        if traj.error:
            raise RuntimeError(traj.error)
        return traj.output

    def close(self) -> None:
        self._worker.close()


def _no_agent(task: dict, ctx: Any) -> Any:
    raise UserError("this system was loaded without an agent; pass agent=... to evolve.load")


def _no_reward(task: dict, output: Any) -> float:
    return 0.0


def load(
    path: str | Path,
    system: str = "current",
    *,
    agent: str | Callable | None = None,
    reward: str | Callable | None = None,
) -> LoadedSystem:
    """Load an evolved system from a run directory (``current``/``best``/``baseline``/an id prefix)
    or from a folder written by ``evolve archive export``. ``agent`` and ``reward`` (functions or
    import paths) default to those the run recorded; a run given functions records only their
    names, so pass them again here."""
    p = Path(path)
    if (p / "archive.sqlite").exists():
        from evolve.archive import Archive

        archive = Archive(p, create=False)
        try:
            sid = _resolve_system(archive, system)
            sys_ = archive.get_system(sid)
            task = json.loads(archive.get_state("task") or "{}")
            base_dir = archive.get_state("base_dir")
        finally:
            archive.close()
        return LoadedSystem(
            sys_,
            p / "artifacts",
            agent or _importable(task.get("agent"), "agent", base_dir),
            reward or _importable(task.get("reward"), "reward", base_dir),
            search_path=base_dir,
        )
    if (p / "system.json").exists():
        data = json.loads((p / "system.json").read_text())
        sys_ = System.model_validate(data.get("system", data))
        return LoadedSystem(sys_, p / "artifacts", agent, reward)
    raise RunDirError(f"{p} is neither a run directory (archive.sqlite) nor an exported system (system.json)")


def _importable(path: str | None, what: str, base_dir: str | None) -> str | None:
    """The recorded import path of the run's agent or reward, or an error saying to pass it when
    the run was given a function that cannot be imported by that name (a lambda, a function of a
    script or a notebook)."""
    if not path:
        return None
    from evolve.registry import import_path

    try:
        import_path(path, what=what, search=Path(base_dir) if base_dir else None)
    except UserError:
        raise UserError(
            f"the run's {what} was {path!r}, which cannot be imported here (a function defined in a "
            f"script or notebook?); pass it: evolve.load(..., {what}=your_{what})"
        ) from None
    return path


TEMPLATE = """\
# evolvekit task file. Reference: README.md ("Task file"). Validate with: evolve run THIS --set budget.generations=0
name: my-task
seed: 0

# agent(task, ctx) -> output; reward(task, output[, trajectory]) -> float | Reward
agent: my_agent:agent          # a module beside this file, or any importable package
reward: my_agent:reward

models:
  policy:
    backend: litellm           # local | litellm | scripted
    name: openai/gpt-4o-mini   # any litellm model id
    params: {temperature: 0.0, max_tokens: 256}

prompts:
  instruction: "Answer the question."

dataset:                       # JSONL files (one task per line, each with an "id"), or source: module:function
  train: data/train.jsonl
  val: data/val.jsonl
  test: data/test.jsonl

operators: []                  # e.g. [{name: star, params: {samples: 4}}]

runner: {name: thread, workers: 8, timeout: 60}
budget: {generations: 3, rollouts: 2000, usd: 5.0}
engine: {minibatch: 32}
"""
