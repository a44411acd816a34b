"""DSPy's optimisers as baselines on the same task file: ``evolve baseline dspy TASK --optimizer NAME``.

:func:`run_dspy_baseline` compiles the task's DSPy program (its agent must be a
:class:`~evolve.prompts.dspy_interop.DSPyAgent`) with ``dspy.BootstrapFewShot``, ``dspy.MIPROv2``
or ``dspy.GEPA``:

* **same data**: the task's train split is the optimiser's trainset, its val split the valset;
* **same metric**: the task's reward (``Reward.feedback`` is GEPA's feedback text);
* **same model**: the system's model for the program's role, built by the same backend
  (``litellm`` with its name, api_base and key; ``local``; ``scripted``) and served to DSPy by an
  in-process OpenAI-compatible server on 127.0.0.1 that counts every call the optimiser makes;
* **same measurement**: the compiled program's instructions and demos become a system (the
  baseline system with those prompt components) that the engine scores on the test split through
  the same rollout path as an evolved system, in an archive of its own (``evolve eval``,
  ``evolve archive show`` and ``evolve.load`` work on it).

``budget`` is in LLM calls the optimiser may spend; :func:`plan` maps it onto each optimiser's
knobs (an estimate: a program run is taken to cost one call per predictor). The calls actually
spent are counted and reported. ``budget=None`` uses DSPy's own defaults (``auto="light"``).
Results: ``RUN_DIR/dspy_baseline.json`` and the compiled program in ``RUN_DIR/program.json``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError, LLMError, MissingDependency, UserError
from evolve.prompts.dspy_interop import (
    apply_components,
    as_dspy_agent,
    components_from_program,
    import_dspy,
    make_adapter,
    openai_lm,
    prediction_output,
)
from evolve.types import Reward

OPTIMIZERS = {"bootstrap": "BootstrapFewShot", "mipro": "MIPROv2", "gepa": "GEPA"}
EVAL_OVERRIDES = ("operators=[]", "budget={generations: 0}")  # a baseline runs no operator and no budget cuts it


class CountingLLM:
    """The optimiser's model: counts every call it answers or fails (tokens, cost); thread-safe."""

    def __init__(self, llm: Any) -> None:
        self._llm, self.name = llm, getattr(llm, "name", "model")
        self._lock = threading.Lock()
        self.calls = self.errors = self.prompt_tokens = self.completion_tokens = 0
        self.cost = 0.0
        self.first_error: str | None = None

    def complete(self, messages: Any, **kw: Any) -> Any:
        try:
            out = self._llm.complete(messages, **kw)
        except Exception as e:
            with self._lock:
                self.calls += 1
                self.errors += 1
                self.first_error = self.first_error or f"{type(e).__name__}: {e}"
            raise
        with self._lock:
            self.calls += 1
            self.prompt_tokens += out.prompt_tokens
            self.completion_tokens += out.completion_tokens
            self.cost += out.cost or 0.0
        return out

    def close(self) -> None:
        pass

    def totals(self) -> dict[str, Any]:
        with self._lock:
            return {
                "llm_calls": self.calls,
                "llm_errors": self.errors,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cost": round(self.cost, 6),
            }


class TaskMetric:
    """The task's reward as a DSPy metric: ``metric(example, pred, trace=None, pred_name=None, pred_trace=None)``.
    Returns the score, or with ``feedback=True`` (GEPA) ``dspy.Prediction(score, feedback)``."""

    def __init__(self, reward_fn: Any, output: str | None, *, feedback: bool = False) -> None:
        self.reward_fn, self.output, self.feedback = reward_fn, output, feedback
        self.calls = 0
        self._lock = threading.Lock()

    def reward(self, example: Any, pred: Any) -> Reward:
        from evolve.rollout import jsonable, score
        from evolve.types import Trajectory

        task = example.toDict()  # the task itself: an example holds every task key (see to_examples)
        try:
            output = prediction_output(pred, self.output)
        except Exception as e:  # noqa: BLE001 - the program gave no such field
            return Reward(score=0.0, feedback=f"the program's prediction has no usable {self.output!r}: {e}")
        traj = Trajectory(task_id=str(task["id"]), system_id="dspy-baseline", output=jsonable(output))
        reward = score(self.reward_fn, task, traj).reward
        assert reward is not None  # score() attaches one, whatever the reward function did
        return reward

    def __call__(
        self, example: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None
    ) -> Any:
        with self._lock:
            self.calls += 1
        r = self.reward(example, pred)
        if not self.feedback:
            return r.score
        dspy = import_dspy()
        return dspy.Prediction(score=r.score, feedback=r.feedback or f"This answer scored {r.score:g}.")


def to_examples(tasks: Sequence[dict], inputs: Sequence[str] | dict[str, str]) -> list[Any]:
    """``dspy.Example``\\ s holding every task key plus the program's inputs (marked as inputs)."""
    dspy = import_dspy()
    pairs = list(inputs.items()) if isinstance(inputs, dict) else [(k, k) for k in inputs]
    clash = sorted(arg for arg, key in pairs if arg != key and any(arg in t for t in tasks))
    if clash:
        raise ConfigError(
            f"workflow.dspy.inputs: the program's input(s) {clash} are also task keys with other "
            "values; rename the program's inputs"
        )
    return [
        dspy.Example(**{**t, **{arg: t[key] for arg, key in pairs}}).with_inputs(*[a for a, _ in pairs]) for t in tasks
    ]


def _clamp(x: float, lo: int, hi: int) -> int:
    return max(lo, min(int(x), hi)) if hi >= lo else hi


def plan(optimizer: str, budget: int | None, *, n_predictors: int, n_train: int, n_val: int) -> dict[str, Any]:
    """The optimiser's knobs for a budget of ``budget`` LLM calls (``None``: DSPy's defaults), with
    the trainset/valset sizes used and the estimated calls. One program run is taken to cost
    ``n_predictors`` calls (``c``)."""
    c = max(1, n_predictors)
    if budget is None:
        if optimizer == "bootstrap":
            return {"train": n_train, "max_bootstrapped_demos": 4, "max_labeled_demos": 16, "max_rounds": 1}
        return {"auto": "light", "train": n_train, "val": n_val}
    if budget < 1:
        raise UserError(f"--budget must be at least 1 LLM call; got {budget}")
    if optimizer == "bootstrap":  # one attempt per training example, stopping at 4 successful traces
        t = _clamp(budget // c, 1, n_train)
        return {
            "train": t,
            "max_bootstrapped_demos": 4,
            "max_labeled_demos": 4,
            "max_rounds": 1,
            "estimated_llm_calls": t * c,
        }
    if optimizer == "gepa":  # an iteration: 2 x 3 program runs on a minibatch, 1 reflection call
        runs = 6 * budget // (6 * c + 1)
        v = _clamp(runs // 3, 1, n_val)  # GEPA's first step scores the whole valset
        calls = max(runs, v + 1)
        return {
            "max_metric_calls": calls,
            "reflection_minibatch_size": 3,
            "train": n_train,
            "val": v,
            "estimated_llm_calls": calls * c + calls // 6,
        }
    # MIPROv2 with auto=None: n demo sets (n - 2 bootstrapped over the trainset), n instructions per
    # predictor (+ program/data description calls), an initial and a final full eval of the valset,
    # then trials on minibatches (a full eval every 5 trials).
    n = 3 if budget < 600 else 6
    t = _clamp(budget // (5 * c * (n - 2)), 2, n_train)
    v = _clamp(budget // (5 * c), 2, n_val)
    minibatch = v > 20
    m = min(35, v // 2) if minibatch else v
    fixed = c * (n - 2) * t + (n + 1) * c + t // 10 + 2 + 2 * c * v
    per_trial = c * m + (c * v / 5 if minibatch else 0)
    trials = max(1, int((budget - fixed) // per_trial))
    return {
        "num_candidates": n,
        "num_trials": trials,
        "minibatch": minibatch,
        "minibatch_size": m,
        "max_bootstrapped_demos": 4,
        "max_labeled_demos": 4,
        "train": t,
        "val": v,
        "estimated_llm_calls": int(fixed + trials * per_trial),
    }


def compile_program(
    optimizer: str,
    student: Any,
    knobs: dict[str, Any],
    metric: TaskMetric,
    lm: Any,
    trainset: list,
    valset: list,
    *,
    seed: int = 0,
    threads: int = 4,
    threshold: float | None = None,
) -> Any:
    """Run one DSPy optimiser with ``knobs`` (from :func:`plan`) under the current ``dspy.context``."""
    dspy = import_dspy()
    train, val = trainset[: knobs["train"]], valset[: knobs.get("val", len(valset))]
    if optimizer == "bootstrap":
        opt = dspy.BootstrapFewShot(
            metric=metric,
            metric_threshold=threshold,
            max_bootstrapped_demos=knobs["max_bootstrapped_demos"],
            max_labeled_demos=knobs["max_labeled_demos"],
            max_rounds=knobs["max_rounds"],
        )
        return opt.compile(student, trainset=train)
    if optimizer == "mipro":
        try:
            import optuna  # noqa: F401 - MIPROv2 searches with it
        except ImportError:
            raise MissingDependency(
                "dspy.MIPROv2 needs the Python package 'optuna'; install it with: pip install 'evolvekit[prompts]'"
            ) from None
        auto = knobs.get("auto")
        opt = dspy.MIPROv2(
            metric=metric,
            prompt_model=lm,
            task_model=lm,
            auto=auto,
            num_candidates=None if auto else knobs["num_candidates"],
            num_threads=threads,
            seed=seed,
            max_bootstrapped_demos=knobs.get("max_bootstrapped_demos", 4),
            max_labeled_demos=knobs.get("max_labeled_demos", 4),
            metric_threshold=threshold,
            verbose=False,
            track_stats=False,
        )
        extra = (
            {}
            if auto
            else {
                "num_trials": knobs["num_trials"],
                "minibatch": knobs["minibatch"],
                "minibatch_size": knobs["minibatch_size"],
            }
        )
        return opt.compile(student, trainset=train, valset=val, seed=seed, **extra)
    if optimizer == "gepa":
        from dspy.teleprompt.gepa import InstructionProposer

        budget = {"auto": knobs["auto"]} if knobs.get("auto") else {"max_metric_calls": knobs["max_metric_calls"]}
        # GEPA's own proposer, through the ChatAdapter: its default JSONAdapter asks for a response_format,
        # which the loopback server (evolve serve) refuses
        proposer = InstructionProposer(adapter=make_adapter("chat"))
        opt = dspy.GEPA(
            metric=metric,
            reflection_lm=lm.copy(temperature=1.0),
            num_threads=threads,
            seed=seed,
            instruction_proposer=proposer,
            reflection_minibatch_size=knobs.get("reflection_minibatch_size", 3),
            track_stats=False,
            **budget,
        )
        return opt.compile(student, trainset=train, valset=val)
    raise UserError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZERS)}")


def _task_config(task_file: str | Path, overrides: Sequence[str]) -> tuple[Any, Path, dict]:
    """The task file with overrides applied, without its operators (not used here) and with no run
    budget (evaluation rollouts are never cut); returns the config, its folder and the budget given."""
    from evolve.task.taskfile import apply_override, parse_override, read_task_file, validate_task

    p = Path(task_file)
    data = read_task_file(p)
    for item in overrides:
        keys, value = parse_override(item)
        apply_override(data, keys, value, item)
    given = copy.deepcopy(data.get("budget") or {})
    for item in EVAL_OVERRIDES:
        apply_override(data, *parse_override(item), item)
    return validate_task(data, source=str(p)), p.parent.resolve(), given


def _served(llm: CountingLLM) -> Any:
    from evolve.gateway.local import serve_llm

    return serve_llm(llm, names=["policy"], any_model=True)


def _resume(run_dir: Path, optimizer: str) -> bool:
    """Whether to reopen ``run_dir``: only a DSPy baseline of this optimiser that did not finish (its
    evaluation rollouts are reused); any other run there is refused."""
    from evolve.archive import Archive
    from evolve.errors import RunDirError

    if not (run_dir / "archive.sqlite").exists():
        return False
    if (run_dir / "dspy_baseline.json").exists():
        raise RunDirError(f"{run_dir} already holds a finished DSPy baseline; choose another --out")
    with Archive(run_dir, create=False) as archive:
        started = archive.get_state("dspy_baseline_started")
    if started != optimizer:
        raise RunDirError(f"{run_dir} already holds another run; choose another --out")
    return True


def run_dspy_baseline(
    task_file: str | Path,
    optimizer: str = "bootstrap",
    *,
    budget: int | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    observer: Any = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Compile the task's DSPy program with a DSPy optimiser and score it like an evolved system;
    returns (and writes to ``RUN_DIR/dspy_baseline.json``) what it cost and what it scored."""
    from evolve._env import quiet_defaults
    from evolve.registry import did_you_mean, import_path
    from evolve.runners import Worker
    from evolve.scoring.session import Session

    quiet_defaults()
    if optimizer not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {optimizer!r}; {did_you_mean(optimizer, sorted(OPTIMIZERS))}")
    if budget is not None and budget < 1:
        raise UserError(f"--budget must be at least 1 LLM call; got {budget}")
    dspy = import_dspy()
    cfg, base, budget_given = _task_config(task_file, overrides)
    dagent = as_dspy_agent(import_path(cfg.agent, what="agent", search=base), cfg.workflow, base)
    s = dagent.resolved(cfg.workflow)
    run_dir = Path(out) if out is not None else Path.cwd() / "runs" / f"{cfg.name}-seed{cfg.seed}-dspy-{optimizer}"
    session = Session(cfg, base_dir=base, run_dir=run_dir, observer=observer, resume=_resume(run_dir, optimizer))
    try:
        session.archive.put_state("dspy_baseline_started", optimizer)
        baseline = session.baseline()
        start = dict(baseline.prompts) or dagent.initial_prompts()
        student = apply_components(dagent.program, start)
        train, val = session.splits["train"], session.splits["val"]
        knobs = plan(optimizer, budget, n_predictors=len(student.predictors()), n_train=len(train), n_val=len(val))
        metric = TaskMetric(session.reward, s["output"], feedback=optimizer == "gepa")
        params = baseline.models[s["role"]].params
        worker, server = Worker(session.spec), None
        t0 = time.monotonic()
        try:
            counter = CountingLLM(worker.llm(baseline, s["role"]))
            server = _served(counter)
            lm = openai_lm(
                server.url,
                model=f"openai/{s['role']}",
                temperature=params.get("temperature"),
                max_tokens=params.get("max_tokens"),
            )
            with dspy.context(lm=lm, adapter=make_adapter(s["adapter"])):
                compiled = compile_program(
                    optimizer,
                    student,
                    knobs,
                    metric,
                    lm,
                    to_examples(train, s["inputs"]),
                    to_examples(val, s["inputs"]),
                    seed=cfg.seed,
                    threads=min(cfg.runner.workers, 16),
                    threshold=threshold,
                )
        finally:
            if server is not None:
                server.close()
            worker.close()
        seconds = round(time.monotonic() - t0, 2)
        if counter.errors == counter.calls:  # nothing to compare: say so rather than report a score
            raise LLMError(
                f"dspy.{OPTIMIZERS[optimizer]} made {counter.calls} calls to the model and none succeeded"
                + (f"; the first failed with {counter.first_error}" if counter.first_error else "")
            )
        components = components_from_program(compiled)
        system = baseline.replace(prompts={**start, **components})
        spent = {**counter.totals(), "metric_calls": metric.calls}
        session.archive.add_system(
            system,
            parents=(baseline.id,),
            operator=f"dspy.{optimizer}",
            rationale=f"dspy.{OPTIMIZERS[optimizer]} on {knobs['train']} training tasks",
            info={"knobs": knobs, "spent": spent},
        )
        session.archive.set_current(system.id, reason=f"dspy {optimizer}")
        split = "test" if session.splits.get("test") else "val"
        before = session.evaluate(baseline, split)
        after = session.evaluate(system, split)
        compiled.save(str(run_dir / "program.json"))
        result = {
            "task": cfg.name,
            "seed": cfg.seed,
            "optimizer": optimizer,
            "dspy_class": f"dspy.{OPTIMIZERS[optimizer]}",
            "dspy_version": dspy.__version__,
            "run_dir": str(run_dir),
            "role": s["role"],
            "model": {"backend": baseline.models[s["role"]].backend, "name": baseline.models[s["role"]].name},
            "budget": {"llm_calls": budget, "task_budget": budget_given},
            "knobs": knobs,
            "spent": spent,
            "compile_seconds": seconds,
            "split": split,
            "baseline": {"system_id": baseline.id, "score": before[0], "n": before[1]},
            "compiled": {"system_id": system.id, "score": after[0], "n": after[1], "prompts": components},
            "eval_usage": session.archive.usage(),
            # the run was made with the task's operators dropped and no budget: `evolve eval` needs the same
            "eval_overrides": [*overrides, *EVAL_OVERRIDES],
        }
        session.archive.put_state("dspy_baseline", result)
        (run_dir / "dspy_baseline.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
        return result
    finally:
        session.close()
        session.archive.close()


__all__ = ["CountingLLM", "OPTIMIZERS", "TaskMetric", "compile_program", "plan", "run_dspy_baseline", "to_examples"]
