"""The task file: YAML validated once by frozen pydantic models with ``extra="forbid"``.

Precedence: model defaults < YAML < ``--set key=value`` overrides. Every user mistake
becomes a :class:`~evolve.errors.ConfigError` naming the file, the YAML path and the fix,
e.g. ``task.yaml: operators.0.params.temprature: unknown field; did you mean 'temperature'?``
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evolve.errors import ConfigError, UserError
from evolve.registry import did_you_mean


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ColdStart(Strict):
    """Stage 1 of the article: SFT of a freshly built tiny model on a small demo set (cached); with
    ``params.weights`` naming a pretrained checkpoint, LoRA SFT of that checkpoint on the demos."""

    demos: str = Field(description="import path of demos(tasks, n=..., seed=...) -> list of chat transcripts "
                       "(default: the world's coldstart.demos hook)")
    n_demos: int = Field(300, ge=1, description="training tasks the demos are made from")
    epochs: int = Field(30, ge=1, description="upper bound; the best validation checkpoint is kept")
    lr: float = Field(3e-3, gt=0, description="learning rate (AdamW)")
    batch_size: int = Field(32, ge=1, description="demo turns per optimizer step")
    eval_every: int = Field(100, ge=1, description="optimizer steps between validation checks")
    n_eval: int = Field(100, ge=1, description="validation tasks used to pick the checkpoint")
    tiny: dict[str, Any] = Field(default_factory=dict, description="TinyConfig overrides (d_model, n_layers, ...)")
    tokenizer: Literal["char", "pointer"] = Field(
        "pointer", description="pointer: words rare in the demos become copy pointers (evolve.policy.pointer)")
    keep_share: float = Field(0.05, gt=0, le=1, description="pointer: a word is vocabulary if in this share of demos")
    augment: int = Field(0, ge=0, description="extra renamed copies per demo, passed to the demos function")
    pointer_words: str | None = Field(None, description=(
        "pointer: import path of a callable(tasks) -> words that are always pointers, however frequent "
        "(e.g. evolve.worlds.sql:name_words), so names seen in training are copied the way unseen ones are"))

    @model_validator(mode="after")
    def _pointer_options_need_the_pointer_tokenizer(self) -> "ColdStart":
        # The char tokenizer has no pointers: these options would be ignored without a word.
        given = sorted({"pointer_words", "keep_share"} & self.model_fields_set)
        if self.tokenizer == "char" and given:
            names, verb = " and ".join(given), "apply" if len(given) > 1 else "applies"
            raise ValueError(f"{names} {verb} only with tokenizer: pointer (this cold start uses "
                             f"tokenizer: char, which spells every word); remove {names} or set "
                             f"tokenizer: pointer")
        return self


class ModelConfig(Strict):
    """One model role of the starting system (``models: {policy: ...}``)."""

    backend: str = Field("local", description="local | litellm | scripted | a plugin's (evolve.registry.llm_backends)")
    name: str = Field("tiny-char-llama", description="the model's name: a litellm model id (openai/gpt-4o-mini, "
                      "anthropic/..., hosted_vllm/...), or a label for a local or scripted model")
    params: dict[str, Any] = Field(default_factory=dict, description="the backend's settings (temperature, max_tokens, "
                                   "api_base, api_key_env, weights, ...: evolve.llm.params lists each backend's)")
    cold_start: ColdStart | None = Field(None, description="local only: build and SFT a tiny model (or LoRA SFT "
                                         "params.weights) on demos before the run")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.backend == "local" and self.cold_start is None and "weights" not in self.params:
            raise ValueError(
                "a local model needs either 'cold_start' (build and SFT a tiny model) or params.weights "
                "(a Hugging Face checkpoint directory or cached Hub id, or a file saved by "
                "evolve.policy.weights.save_base)"
            )
        if self.cold_start is not None and "weights" in self.params:
            # a pretrained checkpoint plus a cold start: LoRA SFT of the checkpoint on the demos
            tiny_only = sorted({"tiny", "tokenizer", "keep_share", "pointer_words"} & self.cold_start.model_fields_set)
            if tiny_only:
                raise ValueError(f"cold_start.{', '.join(tiny_only)} describe(s) a tiny model built here, but "
                                 "params.weights names ready-made weights (then the cold start is LoRA SFT on "
                                 f"them, with their own tokenizer); remove {', '.join(tiny_only)} or params.weights")
        return self


class DatasetConfig(Strict):
    """The tasks: a generator, or JSONL files relative to the task file (a world gives its generator)."""

    source: str | None = Field(None, description="import path of a callable(seed=..., **params) -> {split: tasks}")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of source")
    train: str | None = Field(None, description="JSONL file, one task per line (each with an 'id')")
    val: str | None = Field(None, description="JSONL file of validation tasks (acceptance, the cold start's checkpoint)")
    test: str | None = Field(None, description="JSONL file of held-out tasks (the report's final scoring)")

    @model_validator(mode="after")
    def _check(self) -> "DatasetConfig":
        files = [self.train, self.val, self.test]
        if self.source is None and (self.train is None or self.val is None):
            raise ValueError("give either 'source' (a generator) or at least 'train' and 'val' JSONL files")
        if self.source is not None and any(files):
            raise ValueError("give either 'source' or 'train'/'val'/'test' files, not both")
        return self


class OperatorConfig(Strict):
    """One operator (``operators: [{name: star, params: {...}}]``); its params are validated by its own model."""

    name: str = Field(description="a registered operator (star, grpo, toolforge, memory, topology, prompt_mutation, "
                      "reflective, bootstrap_demos, prompt_crossover, prompt_choice, scripted) or an import path")
    params: dict[str, Any] = Field(default_factory=dict, description="the operator's settings (docs/ has each layer's)")


class RunnerConfig(Strict):
    """Where rollouts run."""

    name: str = Field("thread", description="thread (in-process) | process (kills hung agents) | a plugin's")
    workers: int = Field(32, ge=1, description="rollouts at once")
    timeout: float = Field(60.0, gt=0, description="seconds per rollout before it is recorded as failed")


class BudgetConfig(Strict):
    """When the run stops (the first budget spent); the final test scoring is outside every budget."""

    generations: int = Field(3, ge=0, description="generations after the baseline's (0: score the baseline only)")
    rollouts: int | None = Field(None, ge=1, description="rollouts (exact: only as many as fit start)")
    calls: int | None = Field(None, ge=1, description="LLM calls recorded in rollouts (LLMCall steps)")
    tokens: int | None = Field(None, ge=1, description="tokens of every recorded model call")
    usd: float | None = Field(None, gt=0, description="money, as litellm prices the calls")
    seconds: float | None = Field(None, gt=0, description="wall time, over all of a resumed run's sessions")
    calls_per_rollout: float | None = Field(
        None, gt=0, description="LLM calls one rollout makes (at most): the dry run's estimate, and how many rollouts "
        "may start within what is left of 'calls' (default: 1 for the estimate; the most seen so far in the run)")


class ReevalConfig(Strict):
    """Noisy graders: a child whose val score is within ``margin`` of its parent's (or of the
    best system's) is scored again, with ``samples`` more samples per val task for both, and
    the decision is taken on the means."""

    margin: float = Field(0.02, ge=0, description="a val difference at most this close is re-evaluated")
    samples: int = Field(2, ge=1, description="extra samples per val task for each of the two systems")


class EngineConfig(Strict):
    """How each generation picks parents, compares children and decides (:mod:`evolve.loop`)."""

    minibatch: int = Field(64, ge=1, description="training tasks per generation for stage-1 acceptance")
    parents: int = Field(1, ge=1, description="parents selected per generation")
    selector: str = Field("best", description="best | tournament | pareto | an import path (evolve.selectors)")
    selector_params: dict[str, Any] = Field(default_factory=dict, description="passed to the selector's "
                                            "constructor, e.g. {objectives: [cost, latency]} for selector: pareto")
    min_gain: float = Field(0.0, description="stage 1: child must beat its parent on the minibatch by more than this")
    val_tolerance: float = Field(0.0, ge=0, description="stage 2: child may be at most this much worse on val")
    val_size: int | None = Field(None, ge=1, description="validation tasks used (default: all)")
    test_size: int | None = Field(None, ge=1, description="test tasks used (default: all)")
    reeval: ReevalConfig | None = Field(None, description="re-evaluate close calls on val (off by default)")
    acceptance: str = Field("two_stage", description="two_stage (minibatch, then val) | val_only | an import path "
                            "(evolve.loop.Acceptance)")
    minibatch_sampler: str = Field("random", description="random (anew each generation) | fixed | an import path")
    stopping: str = Field("budget", description="budget (the budgets alone) | plateau | an import path")
    stopping_params: dict[str, Any] = Field(default_factory=dict, description="e.g. {patience: 2} for plateau")


class FailuresConfig(Strict):
    """What a run does when rollouts fail (:mod:`evolve.failures`). The world failing under a
    rollout (the model unreachable, a rate limit, a server error, a dead worker process) is never
    a score: such a rollout is run again after ``backoff`` seconds, doubled on each retry up to
    ``max_backoff``, at most ``retries`` times (while the time budget allows), and if it still
    fails the run stops with exit code 3, keeping everything finished, so that ``--resume``
    continues once the world is back. A failure that retrying cannot mend (a bad key, a model
    that does not exist, a missing package) stops the run at once. The agent's own failures
    (it raised, timed out, its reward failed) are scores of 0: a run whose baseline, or whose
    candidates taken together, failed on more than ``max_share`` of their rollouts ends with
    exit code 1 and names the most common error."""

    retries: int = Field(5, ge=0, description="re-runs of a rollout the world failed under")
    backoff: float = Field(2.0, ge=0, description="seconds before the first re-run; doubled for each next one")
    max_backoff: float = Field(60.0, ge=0, description="the longest wait between two re-runs (seconds)")
    max_share: float = Field(0.5, ge=0, le=1, description="the share of the baseline's (or of the candidates') "
                             "rollouts that may fail by the agent's or the reward's own error before the run fails")


class TaskConfig(Strict):
    """A task file: what to evolve, on which tasks, with which operators, under which budget."""

    name: str = Field("task", description="names the default run directory runs/NAME-seedN")
    seed: int = Field(0, description="all randomness derives from it (a seeded run with a deterministic model repeats)")
    world: str | None = Field(None, description="a world (evolve.worlds): a registered name (sql, toy) or an import "
                              "path; fills agent, reward, dataset.source, cold_start.demos and operators' world "
                              "settings the task file leaves out")
    agent: str = Field(description="import path of agent(task, ctx) -> output (or the world's)")
    reward: str = Field(description="import path of reward(task, output[, trajectory]) -> float | Reward (or the "
                        "world's)")
    models: dict[str, ModelConfig] = Field(description="role -> model; the agent calls ctx.llm(role)")
    prompts: dict[str, str] = Field(default_factory=dict, description="the starting system's named prompt components")
    workflow: dict[str, Any] = Field(default_factory=dict, description="settings the agent reads from "
                                     "ctx.system.workflow; graph: a workflow graph (evolve.topology)")
    tools: str | None = Field(None, description="a tool library JSON file, relative to the task file: {name: tool}, "
                              "e.g. the tools.json the toolforge operator writes; the starting system gets it")
    memory: dict[str, Any] = Field(default_factory=dict, description="the starting system's memory: {store: folder "
                                   "(relative to the task file), version, k, kinds, ...}; the agent reads it")
    dataset: DatasetConfig = Field(description="the tasks (or the world's)")
    operators: list[OperatorConfig] = Field(default_factory=list, description="each proposes children every generation")
    runner: RunnerConfig = Field(RunnerConfig(), description="where rollouts run")
    budget: BudgetConfig = Field(BudgetConfig(), description="when the run stops")
    engine: EngineConfig = Field(EngineConfig(), description="the loop's settings and policies")
    failures: FailuresConfig = Field(FailuresConfig(), description="retries of the world failing, when a run has failed")
    reward_range: tuple[float, float] = Field((0.0, 1.0), description="the scores the reward is meant to give: "
                                              "rollouts scored outside are counted in the report")
    out: str | None = Field(None, description="run directory (default runs/<name>-seed<seed>)")

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if not self.models:
            raise ValueError("'models' is empty; add at least one role, e.g. models: {policy: {backend: litellm, name: gpt-4o-mini}}")
        lo, hi = self.reward_range
        if not (lo < hi) or any(x != x or x in (float("inf"), float("-inf")) for x in (lo, hi)):
            raise ValueError(f"reward_range must be two finite numbers [low, high] with low < high; got [{lo}, {hi}]")
        return self


# ----------------------------------------------------------------------------- loading


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: write it as key.path=value, e.g. --set budget.generations=2")
    key, _, raw = item.partition("=")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return [p for p in key.strip().split(".") if p], value


def apply_override(data: dict, path: list[str], value: Any, item: str) -> None:
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {item!r}: {'.'.join(path[:i + 1])} is not an index of a list of {len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ConfigError(f"--set {item!r}: {'.'.join(path[:i])} is a value, not a mapping")


def _model_at(loc: tuple, root: type[BaseModel] = None) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for did-you-mean)."""
    model: Any = root or TaskConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        ann = fields[part].annotation
        model = inner_model(ann)
        if model is None:
            return None
    return model if hasattr(model, "model_fields") else None


def inner_model(ann: Any) -> Any:
    """The pydantic model class inside an annotation (``X``, ``X | None``, ``dict[str, X]``), or None."""
    import typing

    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = inner_model(arg)
        if found is not None:
            return found
    return None


def format_validation_error(e: ValidationError, source: str, root: type[BaseModel] = None, prefix: str = "") -> str:
    lines = []
    for err in e.errors():
        loc = tuple(err["loc"])
        path = prefix + ".".join(str(p) for p in loc if p not in ("function-after",))
        typ = err["type"]
        if typ == "extra_forbidden":
            owner = _model_at(loc, root)
            hint = did_you_mean(str(loc[-1]), list(owner.model_fields)) if owner else ""
            lines.append(f"{source}: {path}: unknown field; {hint}")
        elif typ == "missing":
            lines.append(f"{source}: {path}: required field is missing; add it")
        elif typ == "value_error":
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {path or '(top level)'}: {msg}")
        else:
            lines.append(f"{source}: {path}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def read_task_file(path: str | Path) -> dict:
    """The task file's YAML as a dict (not validated); a clear ConfigError when it is missing,
    not YAML, or not a mapping."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"task file {str(p)!r} does not exist; create one with: evolve init {p}")
    if p.is_dir():
        raise ConfigError(f"{str(p)!r} is a folder; give the task YAML file (e.g. {p / 'task.yaml'})")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the task file: {getattr(e, 'strerror', None) or e}", source=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError("the task file must be a YAML mapping (key: value lines)", source=str(p))
    return data


def load_task(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[TaskConfig, Path]:
    """Read, override and validate a task file. Returns the config and the file's folder."""
    p = Path(path)
    return validate_task(read_task_file(p), overrides, source=str(p)), p.parent.resolve()


def validate_task(data: dict, overrides: list[str] | tuple[str, ...] = (), source: str = "task") -> TaskConfig:
    data = copy.deepcopy(data)
    for item in overrides:
        keys, value = parse_override(item)
        apply_override(data, keys, value, item)
    if data.get("world"):
        _apply_world(data, source)
    try:
        task = TaskConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None
    _check_operators(task, source)
    _check_workflow(task, source)
    return task


def _apply_world(data: dict, source: str) -> None:
    """Fill what the task file leaves out from its ``world`` (see :mod:`evolve.worlds.base`): agent,
    reward, dataset.source, each local model's cold_start.demos, and the operator params a world
    hook provides (an operator class names them in ``world_params``: param -> hook)."""
    from evolve.registry import operators
    from evolve.worlds.base import load_world

    try:
        world = load_world(str(data["world"]))
    except ConfigError as e:
        raise ConfigError(str(e).removeprefix("world: "), path="world", source=source) from None
    data.setdefault("agent", world.agent)
    data.setdefault("reward", world.reward)
    ds = data.get("dataset")
    if ds is None or (isinstance(ds, dict) and not any(ds.get(k) for k in ("source", "train", "val", "test"))):
        data["dataset"] = {**(ds or {}), "source": world.dataset}
    demos = world.hook("coldstart.demos")
    for m in (data.get("models") or {}).values():
        cs = m.get("cold_start") if isinstance(m, dict) else None
        if isinstance(cs, dict) and "demos" not in cs and demos:
            cs["demos"] = demos
    for op in data.get("operators") or []:
        if not isinstance(op, dict) or op.get("name") not in operators:
            continue
        params = op.setdefault("params", {})
        for param, hook in getattr(operators.get(op["name"]), "world_params", {}).items():
            if isinstance(params, dict) and param not in params and world.hook(hook):
                params[param] = world.hook(hook)


def _check_operators(task: TaskConfig, source: str) -> None:
    """Unknown operator/selector/runner names and operator params are user errors, found at load."""
    from evolve.registry import operators, runners, selectors

    for i, op in enumerate(task.operators):
        try:
            cls = operators.get(op.name)
        except UserError as e:
            raise ConfigError(str(e), path=f"operators.{i}.name", source=source) from None
        params_model = getattr(cls, "Params", None)
        if params_model is not None:
            try:
                params_model.model_validate(op.params)
            except ValidationError as e:
                msg = format_validation_error(e, source, params_model, prefix=f"operators.{i}.params.")
                hooks = getattr(cls, "world_params", {})
                missing = [p for p in hooks if p not in op.params]
                if missing and not task.world:
                    msg += (f", or name a world that provides it (`world: sql` fills {', '.join(missing)} from its "
                            f"{', '.join(hooks[p] for p in missing)} hook)")
                raise ConfigError(msg) from None
    from evolve.registry import acceptances, minibatch_samplers, stoppings

    e = task.engine
    for field, reg, name in (("engine.selector", selectors, e.selector), ("runner.name", runners, task.runner.name),
                             ("engine.acceptance", acceptances, e.acceptance),
                             ("engine.minibatch_sampler", minibatch_samplers, e.minibatch_sampler),
                             ("engine.stopping", stoppings, e.stopping)):
        if name not in reg and ":" not in name:
            raise ConfigError(f"unknown {reg.kind} {name!r}; {did_you_mean(name, reg.names())}", path=field, source=source)
    for field, reg, name, params in (("engine.acceptance", acceptances, e.acceptance, {}),
                                     ("engine.minibatch_sampler", minibatch_samplers, e.minibatch_sampler, {}),
                                     ("engine.stopping", stoppings, e.stopping, e.stopping_params)):
        try:
            reg.get(name)(**params)  # built once per run with these: check they build
        except UserError as e2:
            raise ConfigError(str(e2), path=field, source=source) from None
        except (TypeError, ValueError) as e2:
            where = "engine.stopping_params" if params else field
            raise ConfigError(f"{name}: {e2}", path=where, source=source) from None
    _check_selector_params(task, source)
    from evolve.registry import llm_backends

    from evolve.llm.params import check_keys

    for role, m in task.models.items():
        if m.backend not in llm_backends:
            raise ConfigError(f"unknown {llm_backends.kind} {m.backend!r}; {did_you_mean(m.backend, llm_backends.names())}",
                              path=f"models.{role}.backend", source=source)
        check_keys(role, m.backend, m.params, source)


def _check_workflow(task: TaskConfig, source: str) -> None:
    """The task's workflow settings, checked by the layers that read them
    (:data:`evolve.registry.workflow_checks`; e.g. ``workflow.graph`` must be a valid graph of known
    node types, else every rollout would fail and the run would score 0)."""
    from evolve.registry import workflow_checks

    for name in workflow_checks.names():
        try:
            workflow_checks.get(name)(dict(task.workflow))
        except UserError as e:
            raise ConfigError(str(e), path=f"workflow.{name}", source=source) from None


def _check_selector_params(task: TaskConfig, source: str) -> None:
    """``engine.selector_params`` must fit the selector: its ``Params`` model, else its constructor."""
    import inspect

    from evolve.registry import selectors

    name, params = task.engine.selector, task.engine.selector_params
    cls = selectors.get(name)
    params_model = getattr(cls, "Params", None)
    if params_model is not None:
        try:
            params_model.model_validate(params)
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, source, params_model, prefix="engine.selector_params.")) from None
        return
    try:
        inspect.signature(cls).bind(**params)
    except TypeError:
        accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]
        takes = f"takes {accepted}" if accepted else "takes no parameters"
        raise ConfigError(f"selector {name!r} {takes}; got {sorted(params)}", path="engine.selector_params",
                          source=source) from None


def run_dir_for(task: TaskConfig, base: Path) -> Path:
    if task.out:
        out = Path(task.out)
        return out if out.is_absolute() else Path.cwd() / out
    return Path.cwd() / "runs" / f"{task.name}-seed{task.seed}"


Split = Literal["train", "val", "test"]
