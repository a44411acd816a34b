"""The Python API: the same engine as the CLI, in a few lines.

    import evolve
    report = evolve.run("examples/sql_agent/task.yaml", overrides=["budget.generations=1"])
    app = evolve.load(report["run_dir"])          # the promoted system, ready to run
    out = app.run({"id": "q1", ...})              # one rollout of your agent under it
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from evolve.errors import RunDirError, UserError
from evolve.types import System, Trajectory


def run_task(
    task: str | Path | dict,
    *,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    resume: bool = False,
    observer: Any = None,
    agent: Callable | None = None,
    reward: Callable | None = None,
    base_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run an evolution job from a task file (or a dict with the same fields); return the report."""
    from evolve._env import quiet_defaults
    from evolve.config import load_task, run_dir_for, validate_task
    from evolve.engine import Engine

    quiet_defaults()
    if isinstance(task, dict):
        cfg, base = validate_task(task, overrides), Path(base_dir or Path.cwd()).resolve()
    else:
        cfg, base = load_task(task, overrides)
    run_dir = Path(out) if out is not None else run_dir_for(cfg, base)
    engine = Engine(cfg, base_dir=base, run_dir=run_dir, resume=resume, observer=observer, agent=agent, reward=reward)
    return engine.run()


def dry_run(task: str | Path | dict, *, overrides: Sequence[str] = (), base_dir: str | Path | None = None) -> dict[str, Any]:
    """What a run of ``task`` would spend (rollouts, LLM calls, tokens, money per phase, and where
    a budget would stop it), without running anything; see :mod:`evolve.estimate`."""
    from evolve._env import quiet_defaults
    from evolve.config import load_task, validate_task
    from evolve.estimate import estimate_run

    quiet_defaults()
    if isinstance(task, dict):
        cfg, base = validate_task(task, overrides), Path(base_dir or Path.cwd()).resolve()
    else:
        cfg, base = load_task(task, overrides)
    return estimate_run(cfg, base)


def _resolve_system(archive: Any, which: str) -> str:
    """An id prefix, or current / best / baseline (see :meth:`evolve.archive.Archive.resolve`)."""
    return archive.resolve(which)


def evaluate(task_file: str | Path, run_dir: str | Path, *, system: str = "current", split: str = "test",
             overrides: Sequence[str] = (), observer: Any = None) -> tuple[float, int, str]:
    """Score an archived system on a split of the task's dataset."""
    from evolve.config import load_task
    from evolve.engine import Engine

    cfg, base = load_task(task_file, overrides)
    if not (Path(run_dir) / "archive.sqlite").exists():
        raise RunDirError(f"{run_dir} is not an evolvekit run directory (no archive.sqlite)")
    engine = Engine(cfg, base_dir=base, run_dir=Path(run_dir), resume=True, observer=observer, evaluating=True)
    engine.final = True  # scoring after the run, like the report's: outside the run's budget
    if split not in engine.splits or not engine.splits[split]:
        raise UserError(f"the dataset has no {split!r} split; choose one of {sorted(k for k, v in engine.splits.items() if v)}")
    sid = _resolve_system(engine.archive, system)
    score, n = engine.evaluate(engine.archive.get_system(sid), split)
    engine.runner.close()
    return score, n, sid


class LoadedSystem:
    """An archived system ready to run inside an app: ``run(task)`` does one rollout."""

    def __init__(self, system: System, artifacts_root: Path, agent: str | Callable | None,
                 reward: str | Callable | None = None, search_path: str | None = None) -> None:
        from evolve.runners import Worker, WorkerSpec

        self.system = system
        self._agent = agent
        self._spec = WorkerSpec(agent=agent or _no_agent, reward=reward or _no_reward,
                                artifacts_root=str(artifacts_root), search_path=search_path)
        self._worker = Worker(self._spec)

    @property
    def id(self) -> str:
        return self.system.id

    def llm(self, role: str = "policy") -> Any:
        """The system's model for ``role`` (weights and adapter loaded)."""
        return self._worker.llm(self.system, role)

    def rollout(self, task: dict, *, temperature: float | None = None, timeout: float | None = None) -> Trajectory:
        from evolve.runners import RolloutJob

        return self._worker.execute(RolloutJob(key="app", system=self.system, task=task,
                                               temperature=temperature, timeout=timeout))

    def run(self, task: dict, **kw: Any) -> Any:
        """Run the agent on ``task`` and return its output (raises if the agent failed)."""
        traj = self.rollout(task, **kw)
        if traj.error:
            raise RuntimeError(traj.error)
        return traj.output

    def close(self) -> None:
        self._worker.close()


def _no_agent(task: dict, ctx: Any) -> Any:
    raise UserError("this system was loaded without an agent; pass agent=... to evolve.load")


def _no_reward(task: dict, output: Any) -> float:
    return 0.0


def load(path: str | Path, system: str = "current", *, agent: str | Callable | None = None) -> LoadedSystem:
    """Load an evolved system from a run directory (``current``/``best``/``baseline``/an id prefix)
    or from a folder written by ``evolve archive export``."""
    p = Path(path)
    if (p / "archive.sqlite").exists():
        from evolve.archive import Archive

        archive = Archive(p, create=False)
        sid = _resolve_system(archive, system)
        sys_ = archive.get_system(sid)
        task = json.loads(archive.get_state("task") or "{}")
        base_dir = archive.get_state("base_dir")
        archive.close()
        return LoadedSystem(sys_, p / "artifacts", agent or task.get("agent"), task.get("reward"),
                            search_path=base_dir)
    if (p / "system.json").exists():
        data = json.loads((p / "system.json").read_text())
        sys_ = System.model_validate(data.get("system", data))
        return LoadedSystem(sys_, p / "artifacts", agent)
    raise RunDirError(f"{p} is neither a run directory (archive.sqlite) nor an exported system (system.json)")


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
