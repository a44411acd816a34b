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
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import ConfigDict, Field

from evolve.loop.operators import OperatorContext, capped
from evolve.policy.roles import RoleParams, trained_roles, verdict_examples
from evolve.types import Candidate, LLMCall, System, ToolCall, Trajectory


class STaR:
    name = "star"
    world_params = {"repair": "star.repair"}  # filled from the task's world when not given

    class Params(RoleParams):
        model_config = ConfigDict(extra="forbid", frozen=True)
        tasks: int = Field(400, ge=1, description="training tasks sampled per proposal")
        samples: int = Field(4, ge=1, description="attempts per task (k)")
        temperature: float = Field(1.0, ge=0)
        threshold: float = Field(1.0, description="a trajectory counts as a success at this score or above")
        max_tokens: int | None = Field(
            None,
            ge=1,
            description="each sampled call generates at most this many tokens (default: the workflow's own "
            "cap); long replies are most of a sampling's cost",
        )
        finished_only: bool = Field(
            False,
            description="learn only from attempts whose every model call ended by itself (end of turn or a "
            "stop string), never from one cut at its token cap: a reply that loops until the cap is no example",
        )
        repair: str | None = Field(
            None,
            description="import path of repair(task, reply, *, ended) -> reply | None: STaR's rationalization, "
            "a failed or unfinished attempt's final reply edited until the world's reward would pass it "
            "(the world's star.repair hook, e.g. evolve.worlds.ifeval.repair:repair); learned as the "
            "model's turn; null: learn from attempts that passed alone",
        )
        turns: Literal["final", "all"] = "final"
        dedupe: bool = Field(True, description="learn each distinct (prompt, completion) once")
        r: int = Field(16, ge=1)
        alpha: float = 32
        lr: float = Field(3e-3, gt=0)
        epochs: float = Field(3, gt=0)
        batch_size: int = Field(32, ge=1)
        min_examples: int = Field(8, ge=1, description="propose nothing with fewer successes than this")
        replay: float = Field(
            1.0,
            ge=0,
            description="share of the cold-start demo examples mixed back in "
            "(rejection-sampling fine-tuning keeps the original data so it does not forget)",
        )

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal (for ``evolve run --dry-run``): ``samples`` attempts at ``tasks`` training tasks, one child."""
        return {"rollouts": min(self.p.tasks, plan.train) * self.p.samples, "llm_calls": 0, "children": 1}

    @classmethod
    def check_models(cls, params: dict, models: Any) -> None:
        """Load-time check of ``roles`` against the task file's models (a ConfigError naming them)."""
        from evolve.policy.roles import check_roles

        check_roles(cls.Params(**params), models)

    def _examples(
        self, trajs: list[Trajectory], role: str | None = None
    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The turns of ``role`` (default: ``role``) to learn from ``trajs``, successful ones only."""
        return success_turns(trajs, role or self.p.role, self.p.turns, self.p.dedupe)

    def _repaired(self, tasks: list[dict], trajs: list[Trajectory], wins: list[Trajectory], ctx: Any) -> list:
        """(task id, example) for each attempt not learned as it is whose final reply the world's
        ``repair`` can edit into one that passes: the example is (prompt ids, the context, the
        edited text), tokenized where the adapter trains. One per task and reply."""
        from evolve.registry import import_path

        fix = import_path(str(self.p.repair), what="star repair")
        by_id = {t["id"]: t for t in tasks}
        learned = {id(t) for t in wins}
        out, seen = [], set()
        for t in trajs:
            calls = [s for s in t.steps if isinstance(s, LLMCall) and s.role == self.p.role]
            if id(t) in learned or t.error is not None or not calls or t.task_id not in by_id:
                continue
            last = calls[-1]
            if last.prompt_token_ids is None:
                continue
            text = fix(by_id[t.task_id], last.output, ended=last.finish_reason != "length")
            if not text or (last.prompt_token_ids, text) in seen:
                continue
            seen.add((last.prompt_token_ids, text))
            context = [m.model_dump(mode="json") for m in last.messages]
            out.append((t.task_id, (last.prompt_token_ids, context, text)))
        ctx.log(f"star: {len(out)} attempts not learned as they were are learned as repaired by {self.p.repair}")
        return out

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.policy.sft import trainable_spec

        p = self.p
        specs = {
            r: trainable_spec(parent, r, ctx.log, self.name)
            for r in trained_roles(p, parent.models, getattr(ctx, "generation", 0))
        }
        specs = {r: s for r, s in specs.items() if s is not None}
        if not specs:
            return []
        tasks = ctx.rng.sample(list(ctx.train), min(p.tasks, len(ctx.train)))
        # STaR learns from the token ids and reads no log-prob: CTranslate2 need not return its logits at T
        trajs = ctx.rollouts(
            parent, tasks, samples=p.samples, temperature=p.temperature, logprobs=False, **capped("star", p.max_tokens)
        )
        passed = [t for t in trajs if t.error is None and t.score >= p.threshold]
        wins = [t for t in passed if ended(t)] if p.finished_only else passed
        if p.finished_only:
            ctx.log(
                f"star: {len(passed) - len(wins)} attempts that passed were cut at their token cap "
                "and are not learned from"
            )
        repaired = self._repaired(tasks, trajs, wins, ctx) if p.repair else []
        solved = len({t.task_id for t in wins} | {task_id for task_id, _ in repaired})
        fixed = f" and {len(repaired)} were repaired" if p.repair else ""
        said: str | None = f"star: {len(wins)}/{len(trajs)} samples succeeded{fixed} on {solved}/{len(tasks)} tasks"
        if p.roles is None and p.credit_of(p.role) == "outcome":  # one role: the one line it always was
            said = None
        else:
            ctx.log(str(said))
        per_role: dict[str, list] = {}
        verdicts: dict[str, dict[str, int]] = {}
        for role in specs:
            if p.credit_of(role) == "verdict":
                per_role[role], verdicts[role] = verdict_examples(trajs, role, p.threshold, p.dedupe)
                ctx.log(
                    f"star: {role}: {verdicts[role]['right']} verdicts matched the truth, "
                    f"{verdicts[role]['wrong']} did not, {verdicts[role]['unjudged']} judged an answer "
                    f"with no score; {len(per_role[role])} distinct turns to learn"
                )
            else:
                per_role[role] = self._examples(wins, role) + [ex for _, ex in repaired if role == p.role]
                ctx.log(
                    f"star: {len(wins)}/{len(trajs)} samples succeeded{fixed} on {solved}/{len(tasks)} tasks; "
                    f"{len(per_role[role])} distinct turns to learn"
                    if said is None
                    else f"star: {role}: {len(per_role[role])} distinct turns to learn"
                )
        per_role = {r: ex for r, ex in per_role.items() if len(ex) >= p.min_examples}
        if not per_role:
            return []
        child, stats, n_all = train_roles(parent, specs, per_role, ctx, p)
        n_own = {r: len(ex) for r, ex in per_role.items()}
        info: dict[str, Any] = {
            "tasks": len(tasks),
            "samples": len(trajs),
            "successes": len(wins),
            **({"repaired": len(repaired)} if p.repair else {}),
            "solved_tasks": solved,
        }
        by_role = {
            r: {
                "examples": n_own[r],
                "replayed": n_all[r] - n_own[r],
                "train_loss": stats[r].get("loss"),
                "train_seconds": stats[r].get("seconds"),
                "curve": stats[r].get("curve"),
                "trained_remotely": stats[r].get("trained_in_pid", os.getpid()) != os.getpid(),
                **({"verdicts": verdicts[r]} if r in verdicts else {}),
            }
            for r in per_role
        }
        if len(by_role) == 1 and p.roles is None:  # the single-role shape, as before roles existed
            info.update(next(iter(by_role.values())))
        else:
            info["roles"] = by_role
        n_fixed = {p.role: len(repaired)} if repaired else {}

        def kind(role: str) -> str:
            if role in verdicts:
                return "right verdicts"
            return f"turns ({n_fixed[role]} of them repaired)" if n_fixed.get(role) else "successful turns"

        why = "; ".join(
            f"{'' if p.roles is None else role + ': '}LoRA r={p.r} trained on {n_own[role]} {kind(role)} + "
            f"{n_all[role] - n_own[role]} replayed demos"
            for role in per_role
        )
        why += f" ({len(wins)}/{len(trajs)} samples at T={p.temperature:g} on {len(tasks)} tasks)"
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=info)]


def fit_adapter(
    base: str,
    init: str | None,
    examples: list,
    *,
    r: int,
    alpha: float,
    lr: float,
    epochs: float,
    batch_size: int,
    seed: int,
    device: Any = None,
    dtype: Any = None,
    gradient_checkpointing: bool = False,
    precision: str = "auto",
) -> tuple[bytes, dict]:
    """Train a LoRA adapter on the base weights in the file ``base`` (continued from the adapter in
    ``init``): (the adapter file's bytes, the training stats). Pure: paths in, bytes out, so it runs
    in this process or in a Ray task where the GPUs are (``runner.params.train``). ``precision``:
    :mod:`evolve.policy.precision` (``auto`` keeps a tiny base in float32)."""
    import tempfile
    from pathlib import Path

    from evolve.policy.precision import resolve_precision
    from evolve.policy.train import train_lora
    from evolve.policy.weights import load_base

    model, tok, cfg = load_base(base, device=device, dtype=dtype, gradient_checkpointing=gradient_checkpointing)
    examples = [ex if len(ex) == 2 else written_turn(tok, *ex) for ex in examples]
    precision = resolve_precision(precision, next(model.parameters()).device, tiny=cfg is not None)
    adapter = train_lora(
        model,
        examples,
        r=r,
        alpha=alpha,
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        init=init,
        pad_id=tok.pad_id,
        precision=precision,
    )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "adapter.safetensors"
        adapter.save(path)
        import os

        return path.read_bytes(), {**dict(getattr(adapter, "stats", {}) or {}), "trained_in_pid": os.getpid()}


def written_turn(tok: Any, prompt_ids: Sequence[int], context: Sequence[dict], text: str) -> tuple:
    """(prompt ids, completion ids) of ``text`` written as the assistant's turn after ``context``
    (a repaired reply: it was not sampled, so it is tokenized as the chat template ends a turn)."""
    from evolve.policy.train import turn_ids

    return tuple(prompt_ids), tuple(turn_ids(tok, context, text))


def train_roles(
    parent: System, specs: dict[str, Any], per_role: dict[str, list], ctx: Any, p: Any
) -> tuple[System, dict[str, Any], dict[str, int]]:
    """One child of ``parent`` with a new adapter for each role of ``per_role`` (role -> its examples),
    trained in turn with ``p``'s LoRA settings (``r``, ``alpha``, ``lr``, ``epochs``, ``batch_size``,
    ``replay``): (the child, each role's training stats, each role's examples with replay)."""
    child, stats, n_all = parent, {}, {}
    for role, examples in per_role.items():
        child, stats[role], n_all[role] = train_adapter_child(
            child,
            specs[role],
            role,
            examples,
            ctx,
            r=p.r,
            alpha=p.alpha,
            lr=p.lr,
            epochs=p.epochs,
            batch_size=p.batch_size,
            replay=p.replay,
        )
    return child, stats, n_all


def train_adapter_child(
    parent: System,
    spec: Any,
    role: str,
    examples: list,
    ctx: OperatorContext,
    *,
    r: int,
    alpha: float,
    lr: float,
    epochs: float,
    batch_size: int,
    replay: float,
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
    kw = dict(
        r=r,
        alpha=alpha,
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        seed=ctx.rng.randrange(2**31),
        device=spec.params.get("device"),
        dtype=spec.params.get("dtype"),
        gradient_checkpointing=bool(spec.params.get("gradient_checkpointing")),
        precision=str(spec.params.get("precision", "auto")),
    )
    remote = ctx.extra.get("remote")
    base = str(ctx.artifacts.path(spec.base))
    data, stats = (
        remote(fit_adapter, base, init, examples, **kw)
        if remote is not None
        else fit_adapter(base, init, examples, **kw)
    )
    path = ctx.workdir / "adapter.safetensors"
    path.write_bytes(data)
    ref = ctx.artifacts.put_file(path, "adapter")
    child = parent.replace(models={**parent.models, role: spec.model_copy(update={"adapter": ref})})
    return child, stats, len(examples)


def rejected_turns(steps: Sequence[Any]) -> set[int]:
    """Indices of the LLM calls in ``steps`` whose next step is a tool call that failed."""
    return {
        i
        for i, s in enumerate(steps[:-1])
        if isinstance(s, LLMCall) and isinstance(steps[i + 1], ToolCall) and steps[i + 1].error
    }


def success_turns(
    trajs: list[Trajectory], role: str = "policy", turns: str = "final", dedupe: bool = True
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
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
            if not isinstance(s, LLMCall) or s.prompt_token_ids is None or not s.token_ids:
                continue
            if turns == "final" and (i != calls[-1] or i in rejected):
                continue
            key = (s.prompt_token_ids, s.token_ids)
            if dedupe and key in seen:
                continue
            seen.add(key)
            out.append(key)
    return out


def ended(traj: Trajectory) -> bool:
    """Whether every model call of ``traj`` ended by itself (end of turn or a stop string), none cut
    at its token cap (``finish_reason == "length"``)."""
    return all(s.finish_reason != "length" for s in traj.steps if isinstance(s, LLMCall))
