"""STaR / rejection-sampling fine-tuning: sample, keep what worked, train a LoRA adapter on it.

For a parent system: sample ``samples`` attempts on each of ``tasks`` training tasks at
``temperature`` (memoised rollouts, counted against the budget), keep the successful
trajectories (score >= ``threshold``), and train a LoRA adapter on the model's own tokens in
them — the exact token ids the sampler drew, never re-tokenised text. Prompts, tool results and
user text are context, not targets. By default only the assistant turns that led to the
success are learned (``turns: final``): an attempt that the environment rejected earlier in a
successful trajectory is not reinforced. The child is "parent base + new adapter" (continued
from the parent's adapter when it has one); the base weights never change.
"""

from __future__ import annotations

import os

from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evolve.loop.operators import OperatorContext
from evolve.types import Candidate, LLMCall, System, ToolCall, Trajectory


class STaR:
    name = "star"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        role: str = "policy"
        tasks: int = Field(400, ge=1, description="training tasks sampled per proposal")
        samples: int = Field(4, ge=1, description="attempts per task (k)")
        temperature: float = Field(1.0, ge=0)
        threshold: float = Field(1.0, description="a trajectory counts as a success at this score or above")
        turns: Literal["final", "all"] = "final"
        dedupe: bool = Field(True, description="learn each distinct (prompt, completion) once")
        r: int = Field(16, ge=1)
        alpha: float = 32
        lr: float = Field(3e-3, gt=0)
        epochs: float = Field(3, gt=0)
        batch_size: int = Field(32, ge=1)
        min_examples: int = Field(8, ge=1, description="propose nothing with fewer successes than this")
        replay: float = Field(1.0, ge=0, description="share of the cold-start demo examples mixed back in "
                              "(rejection-sampling fine-tuning keeps the original data so it does not forget)")

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal (for ``evolve run --dry-run``): ``samples`` attempts at ``tasks`` training tasks, one child."""
        return {"rollouts": min(self.p.tasks, plan.train) * self.p.samples, "llm_calls": 0, "children": 1}

    def _examples(self, trajs: list[Trajectory]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        return success_turns(trajs, self.p.role, self.p.turns, self.p.dedupe)

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.policy.sft import trainable_spec

        p = self.p
        spec = trainable_spec(parent, p.role, ctx.log, self.name)
        if spec is None:
            return []
        tasks = ctx.rng.sample(list(ctx.train), min(p.tasks, len(ctx.train)))
        # STaR learns from the token ids and reads no log-prob: CTranslate2 need not return its logits at T
        trajs = ctx.rollouts(parent, tasks, samples=p.samples, temperature=p.temperature, tag="star", logprobs=False)
        wins = [t for t in trajs if t.error is None and t.score >= p.threshold]
        solved = len({t.task_id for t in wins})
        examples = self._examples(wins)
        ctx.log(f"star: {len(wins)}/{len(trajs)} samples succeeded on {solved}/{len(tasks)} tasks; "
                f"{len(examples)} distinct turns to learn")
        if len(examples) < p.min_examples:
            return []
        n_own = len(examples)
        child, stats, n_all = train_adapter_child(parent, spec, p.role, examples, ctx, r=p.r, alpha=p.alpha, lr=p.lr,
                                                  epochs=p.epochs, batch_size=p.batch_size, replay=p.replay)
        info = {"tasks": len(tasks), "samples": len(trajs), "successes": len(wins), "solved_tasks": solved,
                "examples": n_own, "replayed": n_all - n_own, "train_loss": stats.get("loss"),
                "train_seconds": stats.get("seconds"), "curve": stats.get("curve"),
                "trained_remotely": stats.get("trained_in_pid", os.getpid()) != os.getpid()}
        why = (f"LoRA r={p.r} trained on {n_own} successful turns + {n_all - n_own} replayed demos "
               f"({len(wins)}/{len(trajs)} samples at T={p.temperature:g} on {len(tasks)} tasks)")
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=info)]


def fit_adapter(base: str, init: str | None, examples: list, *, r: int, alpha: float, lr: float, epochs: float,
                batch_size: int, seed: int, device: Any = None, dtype: Any = None,
                gradient_checkpointing: bool = False, precision: str = "auto") -> tuple[bytes, dict]:
    """Train a LoRA adapter on the base weights in the file ``base`` (continued from the adapter in
    ``init``): (the adapter file's bytes, the training stats). Pure: paths in, bytes out, so it runs
    in this process or in a Ray task where the GPUs are (``runner.params.train``). ``precision``:
    :mod:`evolve.policy.precision` (``auto`` keeps a tiny base in float32)."""
    import tempfile
    from pathlib import Path

    from evolve.policy.train import train_lora
    from evolve.policy.weights import load_base

    from evolve.policy.precision import resolve_precision

    model, tok, cfg = load_base(base, device=device, dtype=dtype, gradient_checkpointing=gradient_checkpointing)
    precision = resolve_precision(precision, next(model.parameters()).device, tiny=cfg is not None)
    adapter = train_lora(model, examples, r=r, alpha=alpha, lr=lr, epochs=epochs, batch_size=batch_size,
                         seed=seed, init=init, pad_id=tok.pad_id, precision=precision)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "adapter.safetensors"
        adapter.save(path)
        import os

        return path.read_bytes(), {**dict(getattr(adapter, "stats", {}) or {}), "trained_in_pid": os.getpid()}


def train_adapter_child(parent: System, spec: Any, role: str, examples: list, ctx: OperatorContext, *, r: int,
                        alpha: float, lr: float, epochs: float, batch_size: int, replay: float
                        ) -> tuple[System, dict, int]:
    """Train a LoRA adapter on ``examples`` ((prompt ids, target ids) pairs), with ``replay`` of the
    cold-start demos mixed back in, continued from the parent's adapter; store it and return (the
    child "parent base + new adapter", the training stats, how many examples were trained on). The
    training runs where the runner says (``ctx.extra["remote"]``: the ray runner's ``train``
    resources), else here."""
    from evolve.policy.sft import cold_start_examples

    demos = cold_start_examples(spec, ctx.artifacts) if replay > 0 else []
    if demos:
        examples = examples + ctx.rng.sample(demos, min(len(demos), round(replay * len(demos))))
    init = str(ctx.artifacts.path(spec.adapter)) if spec.adapter is not None else None
    kw = dict(r=r, alpha=alpha, lr=lr, epochs=epochs, batch_size=batch_size, seed=ctx.rng.randrange(2**31),
              device=spec.params.get("device"), dtype=spec.params.get("dtype"),
              gradient_checkpointing=bool(spec.params.get("gradient_checkpointing")),
              precision=str(spec.params.get("precision", "auto")))
    remote = ctx.extra.get("remote")
    base = str(ctx.artifacts.path(spec.base))
    data, stats = (remote(fit_adapter, base, init, examples, **kw) if remote is not None
                   else fit_adapter(base, init, examples, **kw))
    path = ctx.workdir / "adapter.safetensors"
    path.write_bytes(data)
    ref = ctx.artifacts.put_file(path, "adapter")
    child = parent.replace(models={**parent.models, role: spec.model_copy(update={"adapter": ref})})
    return child, stats, len(examples)


def rejected_turns(steps: Sequence[Any]) -> set[int]:
    """Indices of the LLM calls in ``steps`` whose next step is a tool call that failed."""
    return {i for i, s in enumerate(steps[:-1])
            if isinstance(s, LLMCall) and isinstance(steps[i + 1], ToolCall) and steps[i + 1].error}


def success_turns(trajs: list[Trajectory], role: str = "policy", turns: str = "final",
                  dedupe: bool = True) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(prompt ids, sampled ids) of the turns of ``role`` in ``trajs`` (pass successful ones) to learn.

    ``turns: final`` keeps only the last turn of the role, and only when the tool call right after
    it did not fail: an attempt the environment rejected earlier in a successful trajectory is not
    reinforced. ``dedupe`` learns each distinct (prompt, completion) once."""
    out, seen = [], set()
    for t in trajs:
        steps = list(t.steps)
        calls = [i for i, s in enumerate(steps) if isinstance(s, LLMCall) and s.role == role]
        rejected = rejected_turns(steps) if turns == "final" else set()
        for i in calls:
            s = steps[i]
            if s.prompt_token_ids is None or not s.token_ids:
                continue
            if turns == "final" and (i != calls[-1] or i in rejected):
                continue
            key = (s.prompt_token_ids, s.token_ids)
            if dedupe and key in seen:
                continue
            seen.add(key)
            out.append(key)
    return out
