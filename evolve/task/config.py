"""The task file's schema: frozen pydantic models with ``extra="forbid"`` (:class:`TaskConfig` and
its sections), and their cross-field checks. Reading a file, ``--set`` overrides, a ``world:``'s
defaults and the checks against the registries are in :mod:`evolve.task.taskfile`; the reference page
``docs/task-file.md`` is generated from these models (:mod:`evolve.task.reference`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.task.deploy import DeployConfig


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ColdStart(Strict):
    """Stage 1 of the article: SFT of a freshly built tiny model on a small demo set (cached); with
    ``params.weights`` naming a pretrained checkpoint, LoRA SFT of that checkpoint on the demos."""

    demos: str = Field(
        description="import path of demos(tasks, seed=..., ...) -> list of chat transcripts; it is "
        "also given those of instruction, template (the prompts' layout), augment, tools and memory it "
        "names (default: the world's coldstart.demos hook)"
    )
    n_demos: int = Field(300, ge=1, description="training tasks the demos are made from")
    epochs: int = Field(30, ge=1, description="upper bound; the best validation checkpoint is kept")
    lr: float = Field(3e-3, gt=0, description="learning rate (AdamW)")
    batch_size: int = Field(32, ge=1, description="demo turns per optimizer step")
    eval_every: int = Field(100, ge=1, description="optimizer steps between validation checks")
    n_eval: int = Field(100, ge=1, description="validation tasks used to pick the checkpoint")
    pick_by: Literal["agent", "demos"] | None = Field(
        None,
        description=(
            "what picks the checkpoint: agent (unset): the agent's greedy accuracy on the validation tasks; "
            "demos: the share of the demos made from the validation tasks whose last reply the model writes "
            "exactly (a judge's yes/no verdicts, where the team's score would say little about one role)"
        ),
    )
    tiny: dict[str, Any] = Field(default_factory=dict, description="TinyConfig overrides (d_model, n_layers, ...)")
    tokenizer: Literal["char", "pointer"] = Field(
        "pointer", description="pointer: words rare in the demos become copy pointers (evolve.policy.pointer)"
    )
    keep_share: float = Field(0.05, gt=0, le=1, description="pointer: a word is vocabulary if in this share of demos")
    augment: int = Field(0, ge=0, description="extra renamed copies per demo, passed to the demos function")
    pointer_words: str | None = Field(
        None,
        description=(
            "pointer: import path of a callable(tasks) -> words that are always pointers, however frequent "
            "(e.g. evolve.worlds.sql:name_words), so names seen in training are copied the way unseen ones are"
        ),
    )

    @model_validator(mode="after")
    def _pointer_options_need_the_pointer_tokenizer(self) -> ColdStart:
        # The char tokenizer has no pointers: these options would be ignored without a word.
        given = sorted({"pointer_words", "keep_share"} & self.model_fields_set)
        if self.tokenizer == "char" and given:
            names, verb = " and ".join(given), "apply" if len(given) > 1 else "applies"
            raise ValueError(
                f"{names} {verb} only with tokenizer: pointer (this cold start uses "
                f"tokenizer: char, which spells every word); remove {names} or set "
                f"tokenizer: pointer"
            )
        return self


class ModelConfig(Strict):
    """One model role of the starting system (``models: {policy: ...}``)."""

    backend: str = Field("local", description="local | litellm | scripted | a plugin's (evolve.registry.llm_backends)")
    name: str = Field(
        "tiny-char-llama",
        description="the model's name: a litellm model id (openai/gpt-4o-mini, "
        "anthropic/..., hosted_vllm/...), or a label for a local or scripted model",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the backend's settings (temperature, max_tokens, "
        "api_base, api_key_env, weights, ...: evolve.llm.params lists each backend's)",
    )
    cold_start: ColdStart | None = Field(
        None, description="local only: build and SFT a tiny model (or LoRA SFT params.weights) on demos before the run"
    )

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
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
                raise ValueError(
                    f"cold_start.{', '.join(tiny_only)} describe(s) a tiny model built here, but "
                    "params.weights names ready-made weights (then the cold start is LoRA SFT on "
                    f"them, with their own tokenizer); remove {', '.join(tiny_only)} or params.weights"
                )
        return self


class DatasetConfig(Strict):
    """The tasks: a generator, or JSONL files relative to the task file (a world gives its generator)."""

    source: str | None = Field(None, description="import path of a callable(seed=..., **params) -> {split: tasks}")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of source")
    train: str | None = Field(None, description="JSONL file, one task per line (each with an 'id')")
    val: str | None = Field(
        None, description="JSONL file of validation tasks (acceptance, the cold start's checkpoint)"
    )
    test: str | None = Field(None, description="JSONL file of held-out tasks (the report's final scoring)")

    @model_validator(mode="after")
    def _check(self) -> DatasetConfig:
        files = [self.train, self.val, self.test]
        if self.source is None and (self.train is None or self.val is None):
            raise ValueError("give either 'source' (a generator) or at least 'train' and 'val' JSONL files")
        if self.source is not None and any(files):
            raise ValueError("give either 'source' or 'train'/'val'/'test' files, not both")
        return self


class OperatorConfig(Strict):
    """One operator (``operators: [{name: star, params: {...}}]``); its params are validated by its own model."""

    name: str = Field(
        description="a registered operator (star, grpo, toolforge, memory, topology, prompt_mutation, "
        "reflective, bootstrap_demos, prompt_crossover, prompt_choice, scripted) or an import path"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the operator's settings (docs/ has each layer's)")


class TrackerConfig(Strict):
    """One tracker the run reports to (``track: [{name: mlflow, params: {...}}]``); its params are
    validated by its own model (docs/tracking.md has each tracker's)."""

    name: str = Field(description="mlflow | wandb | otel | a plugin's or an import path (evolve.registry.trackers)")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the tracker's settings, e.g. for mlflow: tracking_uri, experiment, model_name, alias",
    )


class RunnerConfig(Strict):
    """Where rollouts run."""

    name: str = Field(
        "thread", description="thread (in-process) | process (kills hung agents) | ray (a Ray cluster) | a plugin's"
    )
    workers: int = Field(32, ge=1, description="rollouts at once")
    timeout: float = Field(60.0, gt=0, description="seconds per rollout before it is recorded as failed")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the runner's own settings, e.g. for ray: "
        "address, num_cpus, num_gpus, resources, artifacts (shared | ship), runtime_env",
    )


class BudgetConfig(Strict):
    """When the run stops (the first budget spent); the final test scoring is outside every budget."""

    generations: int = Field(3, ge=0, description="generations after the baseline's (0: score the baseline only)")
    rollouts: int | None = Field(None, ge=1, description="rollouts (exact: only as many as fit start)")
    calls: int | None = Field(None, ge=1, description="LLM calls recorded in rollouts (LLMCall steps)")
    tokens: int | None = Field(None, ge=1, description="tokens of every recorded model call")
    usd: float | None = Field(None, gt=0, description="money, as litellm prices the calls")
    seconds: float | None = Field(None, gt=0, description="wall time, over all of a resumed run's sessions")
    calls_per_rollout: float | None = Field(
        None,
        gt=0,
        description="LLM calls one rollout makes (at most): the dry run's estimate, and how many rollouts "
        "may start within what is left of 'calls' (default: 1 for the estimate; the most seen so far in the run)",
    )


class ReevalConfig(Strict):
    """Noisy graders: a child whose val score is within ``margin`` of its parent's (or of the
    best system's) is scored again, with ``samples`` more samples per val task for both, and
    the decision is taken on the means."""

    margin: float = Field(0.02, ge=0, description="a val difference at most this close is re-evaluated")
    samples: int = Field(2, ge=1, description="extra samples per val task for each of the two systems")


class CurriculumConfig(Strict):
    """A curriculum that follows success (:mod:`evolve.loop.curriculum`): each generation moves every
    group of training tasks (a generator) one difficulty level up when the agent's success on its
    fresh training tasks was above the band, down when below, and shifts the mix of groups toward
    those in the band. Decided from the scores the run stored; the same seed decides the same."""

    band: tuple[float, float] = Field((0.2, 0.8), description="the success rate [low, high] each group is kept within")
    group_key: str = Field("generator", description="the training tasks' field that names their group")
    level_key: str = Field(
        "level",
        description="the training tasks' field that holds their difficulty level "
        "(a whole number, the lowest the easiest)",
    )
    start: int = Field(
        0,
        ge=0,
        description="where every group starts: its levels counted from the easiest, 0 first "
        "(its hardest when it has fewer)",
    )
    window: int = Field(
        1,
        ge=1,
        description="generations of the parents' minibatch rollouts that success is "
        "measured on (at the group's current level only)",
    )
    evidence: Literal["minibatch", "all"] = Field(
        "minibatch",
        description="what success is measured on: the "
        "parents' minibatch rollouts (minibatch), or those and every "
        "rollout the operators sampled from the parents on training tasks "
        "in the same generations, e.g. STaR's and GRPO's samples (all)",
    )
    min_samples: int = Field(4, ge=1, description="rollouts of a group a move needs; with fewer, the group holds")
    solved_at: float = Field(1.0, description="a rollout is a success at this score or above")
    off_band: float = Field(
        0.25,
        gt=0,
        le=1,
        description="weight factor of a group that stays out of the band (too "
        "easy at its hardest level, too hard at its easiest)",
    )

    @model_validator(mode="after")
    def _band(self) -> CurriculumConfig:
        lo, hi = self.band
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"band must be [low, high] with 0 <= low < high <= 1; got [{lo}, {hi}]")
        return self


class EngineConfig(Strict):
    """How each generation picks parents, compares children and decides (:mod:`evolve.loop.strategies`)."""

    minibatch: int = Field(64, ge=1, description="training tasks per generation for stage-1 acceptance")
    parents: int = Field(1, ge=1, description="parents selected per generation")
    selector: str = Field("best", description="best | tournament | pareto | an import path (evolve.loop.selectors)")
    selector_params: dict[str, Any] = Field(
        default_factory=dict,
        description="passed to the selector's constructor, e.g. {objectives: [cost, latency]} for selector: pareto",
    )
    min_gain: float = Field(0.0, description="stage 1: child must beat its parent on the minibatch by more than this")
    val_tolerance: float = Field(0.0, ge=0, description="stage 2: child may be at most this much worse on val")
    val_size: int | None = Field(None, ge=1, description="validation tasks used (default: all)")
    test_size: int | None = Field(None, ge=1, description="test tasks used (default: all)")
    reeval: ReevalConfig | None = Field(None, description="re-evaluate close calls on val (off by default)")
    acceptance: str = Field(
        "two_stage",
        description="two_stage (minibatch, then val) | val_only | paired (minibatch, "
        "then val and promotion on the paired interval) | an import path "
        "(evolve.loop.strategies.Acceptance)",
    )
    acceptance_params: dict[str, Any] = Field(
        default_factory=dict, description="e.g. {z: 2.58} for paired (a 99% interval; 1.96 by default)"
    )
    minibatch_sampler: str = Field("random", description="random (anew each generation) | fixed | an import path")
    stopping: str = Field("budget", description="budget (the budgets alone) | plateau | an import path")
    stopping_params: dict[str, Any] = Field(default_factory=dict, description="e.g. {patience: 2} for plateau")
    curriculum: CurriculumConfig | None = Field(
        None,
        description="training difficulty and mix that follow the "
        "agent's success (off: a fixed mix, the training split as it is)",
    )

    @model_validator(mode="after")
    def _curriculum_draws_the_minibatch(self) -> EngineConfig:
        if self.curriculum is not None and self.minibatch_sampler != "random":
            raise ValueError(
                f"engine.curriculum draws each generation's minibatch itself (fresh tasks at the "
                f"levels it chose); remove engine.minibatch_sampler ({self.minibatch_sampler!r}) or "
                "the curriculum"
            )
        return self


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
    max_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="the share of the baseline's (or of the candidates') "
        "rollouts that may fail by the agent's or the reward's own error before the run fails",
    )


class TaskConfig(Strict):
    """A task file: what to evolve, on which tasks, with which operators, under which budget."""

    name: str = Field("task", description="names the default run directory runs/NAME-seedN")
    seed: int = Field(0, description="all randomness derives from it (a seeded run with a deterministic model repeats)")
    world: str | None = Field(
        None,
        description="a world (evolve.worlds): a registered name (sql, harbor, env, toy) or an import "
        "path; fills agent, reward, dataset.source, cold_start.demos and operators' world "
        "settings the task file leaves out",
    )
    agent: str = Field(description="import path of agent(task, ctx) -> output (or the world's)")
    reward: str = Field(
        description="import path of reward(task, output[, trajectory]) -> float | Reward (or the world's)"
    )
    models: dict[str, ModelConfig] = Field(description="role -> model; the agent calls ctx.llm(role)")
    prompts: dict[str, str] = Field(default_factory=dict, description="the starting system's named prompt components")
    workflow: dict[str, Any] = Field(
        default_factory=dict,
        description="settings the agent reads from ctx.system.workflow; graph: a workflow graph (evolve.topology)",
    )
    tools: str | None = Field(
        None,
        description="a tool library JSON file, relative to the task file: {name: tool}, "
        "e.g. the tools.json the toolforge operator writes; the starting system gets it",
    )
    memory: dict[str, Any] = Field(
        default_factory=dict,
        description="the starting system's memory: {store: folder "
        "(relative to the task file), version, k, kinds, ...}; the agent reads it",
    )
    dataset: DatasetConfig = Field(description="the tasks (or the world's)")
    operators: list[OperatorConfig] = Field(default_factory=list, description="each proposes children every generation")
    runner: RunnerConfig = Field(RunnerConfig(), description="where rollouts run")
    budget: BudgetConfig = Field(BudgetConfig(), description="when the run stops")
    engine: EngineConfig = Field(EngineConfig(), description="the loop's settings and strategies")
    failures: FailuresConfig = Field(
        FailuresConfig(), description="retries of the world failing, when a run has failed"
    )
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="the scores the reward is meant to give: rollouts scored outside are counted in the report",
    )
    out: str | None = Field(None, description="run directory (default runs/<name>-seed<seed>)")
    deploy: DeployConfig | None = Field(
        None,
        description="gates, canary and approval before a candidate serves "
        "users (evolve promote); without it the best system is made current",
    )
    track: list[TrackerConfig] = Field(
        default_factory=list,
        description="trackers the run reports to as it goes "
        "(MLflow, Weights & Biases, OpenTelemetry: docs/tracking.md); a resumed run "
        "may change them",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if not self.models:
            raise ValueError(
                "'models' is empty; add at least one role, e.g. models: {policy: {backend: litellm, name: gpt-4o-mini}}"
            )
        lo, hi = self.reward_range
        if not (lo < hi) or any(x != x or x in (float("inf"), float("-inf")) for x in (lo, hi)):
            raise ValueError(f"reward_range must be two finite numbers [low, high] with low < high; got [{lo}, {hi}]")
        return self
