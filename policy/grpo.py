"""GRPO-family reinforcement learning of a LoRA adapter, as an engine operator.

One proposal runs ``steps`` generation batches, on-policy:

1. sample ``tasks_per_step`` training tasks and roll the *current* system out ``group_size``
   times on each at ``temperature`` (through the engine: memoised in the archive, counted
   against the budget, scored by the task's reward; step 0 samples the parent itself);
2. group advantages (:func:`~evolve.policy.rl.group_advantages`), dropping groups whose
   rewards are all equal (DAPO's dynamic sampling) unless ``dynamic_sampling: false``;
3. pack each trajectory into sequences of the exact sampled token ids with tool output and
   user text masked (:func:`~evolve.policy.grpo_train.pack`); optionally mask truncated ones;
4. update the adapter (:class:`~evolve.policy.grpo_train.Learner`), save it as an artifact,
   and make the next step's system: parent base + the new adapter. The learner lives in the
   driver, or with the ray runner's ``runner.params.train`` in a Ray actor with those resources
   (:class:`~evolve.policy.grpo_train.HostedLearner`: its model loaded there once, each update a
   call that sends the packed sequences and returns the statistics, the adapter's bytes back).

Every ``eval_every`` steps the current system is scored greedily on ``dev_tasks`` training
tasks that are never trained on (the engine's validation split stays the engine's, for
acceptance); the child proposed is the adapter with the best dev score. The per-step curve
(train reward, dev score, KL, clip fractions, tokens/s) goes into the candidate's ``info`` and,
when matplotlib is installed, into ``grpo_curve.png`` in the operator's work folder.

With ``roles`` (:mod:`evolve.policy.roles`) a team learns role by role from the same group
rollouts: each trained role has its own learner (its adapter, its optimiser) and learns its own
turns. A role with ``outcome`` credit takes the trajectory's advantage; a judging role
(``verdict``) is a group of its own calls per task, each rewarded 1 when its verdict matched the
truth of the answer it judged, and gets that group's advantages. ``schedule: alternate`` trains
one role per generation; ``joint`` updates every listed role at each step, and the step's system
carries all their new adapters.
"""

from __future__ import annotations

import json
import math
import random
import time
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from evolve.loop.operators import OperatorContext, capped
from evolve.policy.roles import RoleParams, trained_roles, verdict_counts, verdict_turns
from evolve.types import Candidate, System, Trajectory


class GRPO:
    name = "grpo"

    class Params(RoleParams):
        model_config = ConfigDict(extra="forbid", frozen=True)
        steps: int = Field(20, ge=1, description="generation batches (policy updates) per proposal")
        tasks_per_step: int = Field(32, ge=1)
        group_size: int = Field(8, ge=2, description="rollouts per task (G)")
        temperature: float = Field(1.0, gt=0)
        max_tokens: int | None = Field(
            None,
            ge=1,
            description="each sampled call generates at most this many tokens (default: the workflow's own "
            "cap); a reply cut there is scored as it stands, as TRL's max_completion_length does",
        )
        estimator: Literal["grpo", "dr_grpo", "batch", "rloo", "reinforce_pp"] = "grpo"
        reward_weights: dict[str, float] = Field(
            default_factory=dict,
            description=(
                "extra training reward: weight x the named component of the task's reward (TRL's reward_weights "
                "over several reward functions), added to the score for the advantages only; acceptance and "
                "evaluation keep the task's score"
            ),
        )
        group_reward: str | None = Field(
            None,
            description=(
                "import path of a judge that scores each sampled group in one call, relative to each other (RULER): "
                "an object with rank(task, outputs), or a function(task, outputs), returning a score or Reward per "
                "output; its scores replace the task's score for the advantages only, e.g. an "
                "evolve.gateway.judge.LLMJudge over recorded sessions"
            ),
        )
        loss_type: Literal["grpo", "bnpo", "dapo", "dr_grpo"] = "dapo"
        eps_low: float = Field(0.2, ge=0)
        eps_high: float = Field(0.28, ge=0)
        beta: float = Field(0.0, ge=0, description="k3 KL penalty to the reference (the adapter disabled)")
        importance_level: Literal["token", "sequence"] = "token"
        num_iterations: int = Field(1, ge=1, description="passes over each generation batch (μ)")
        minibatches: int = Field(1, ge=1, description="optimiser steps per pass")
        micro_batch: int = Field(64, ge=1, description="sequences per forward pass (memory only)")
        micro_batch_tokens: int | None = Field(
            None,
            ge=0,
            description=(
                "padded tokens per forward pass (memory only): a pass keeps every layer's activations for the "
                "backward, about 2.9 MB a token on SmolLM2-135M in float32 (bench/training/grpo_memory.py); null: what "
                "keeps about 4 GiB, estimated from the model's shape (about 1,450 on SmolLM2); 0: no cap"
            ),
        )
        negative_weight: float = Field(
            1.0,
            ge=0,
            description=(
                "scale on negative advantages: 1 is the estimator as is; 0 learns only from each group's "
                "better-than-average attempts (positive-sample reinforcement in Zhu et al. 2025, 'The surprising "
                "effectiveness of negative reinforcement'); >1 leans on the failures, as their W-REINFORCE does by "
                "down-weighting successes. Zeroed attempts stay in the loss's normaliser (and the KL term)"
            ),
        )
        dynamic_sampling: bool = Field(True, description="drop groups whose rewards are all equal")
        reinforce_rejected: bool = Field(
            True,
            description=(
                "false: in a trajectory with a positive advantage, a turn whose tool call failed (SQL the database "
                "rejected) is context, not reinforced: STaR's rule for its final turns, here for the policy gradient"
            ),
        )
        mask_truncated: bool = Field(False, description="do not train on trajectories cut by max_tokens")
        truncated_reward: float | None = Field(
            None,
            description=(
                "the training reward of a trajectory with a call cut by max_tokens, in place of its score (DAPO's "
                "overlong punishment in its hard form: a reply that loops until the cap is not credited for what "
                "its first tokens got right); null: scored as it stands. Acceptance and evaluation keep the score"
            ),
        )
        max_completion_length: int | None = Field(None, ge=1, description="dr_grpo's normaliser")
        ptx_coef: float = Field(
            0.0,
            ge=0,
            description="weight of an SFT loss on the cold-start demos per "
            "optimiser step (InstructGPT's PPO-ptx); 0: pure GRPO",
        )
        ptx_batch: int = Field(16, ge=1)
        self_imitation: bool = Field(
            False,
            description=(
                "add each batch's successful final turns to the PPO-ptx pool, so the SFT term also replays the "
                "policy's own successes (self-imitation learning, Oh et al. 2018; RLEP); needs ptx_coef > 0"
            ),
        )
        imitation_threshold: float = Field(1.0, description="a trajectory scoring this or more is a success to replay")
        truth_threshold: float = Field(
            1.0,
            description=(
                "verdict credit: a judged answer is right when a rollout that submitted it scored this or more"
            ),
        )
        lr: float = Field(1e-3, gt=0)
        warmup: int = Field(0, ge=0, description="optimiser steps of linear learning-rate warmup (over the whole run)")
        weight_decay: float = Field(0.0, ge=0)
        grad_clip: float = Field(1.0, ge=0)
        r: int = Field(16, ge=1)
        alpha: float = 32
        dev_tasks: int = Field(200, ge=0, description="training tasks held out of training to pick the best step")
        eval_every: int = Field(5, ge=1)

        @model_validator(mode="after")
        def _needs_ptx(self) -> GRPO.Params:
            if self.self_imitation and self.ptx_coef <= 0:
                raise ValueError(
                    "self_imitation replays successes through the PPO-ptx term: set ptx_coef > 0 "
                    "(e.g. 1.0), or self_imitation: false"
                )
            return self

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self._judge: Any = None

    @classmethod
    def check_models(cls, params: dict, models: Any) -> None:
        """Load-time check of ``roles`` against the task file's models (a ConfigError naming them)."""
        from evolve.policy.roles import check_roles

        check_roles(cls.Params(**params), models)

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal (for ``evolve run --dry-run``): ``steps`` batches of ``tasks_per_step`` x
        ``group_size`` rollouts, plus the greedy dev checks (step 0, every ``eval_every``, the last)."""
        p = self.p
        dev = min(p.dev_tasks, plan.train)
        tasks = min(p.tasks_per_step, max(plan.train - dev, 0))
        checks = len({s for s in range(p.steps + 1) if s % p.eval_every == 0 or s == p.steps}) if dev else 0
        return {"rollouts": p.steps * tasks * p.group_size + checks * dev, "llm_calls": 0, "children": 1}

    # ---------------------------------------------------------------- helpers

    def _judged(self, trajs: list[Trajectory], tasks: list[dict]) -> list[float]:
        """The group judge's score of each trajectory (one call per task's group; a rollout that
        crashed scores 0 and is not shown to the judge). A judge that fails stops the proposal:
        its failure is the world's, not a score."""
        from evolve.registry import import_path

        if self._judge is None:
            got = import_path(str(self.p.group_reward), what="grpo group_reward")
            self._judge = getattr(got, "rank", got)
        by_id = {str(t["id"]): t for t in tasks}
        out = [0.0] * len(trajs)
        groups: dict[str, list[int]] = {}
        for k, t in enumerate(trajs):
            if t.error is None:
                groups.setdefault(t.task_id, []).append(k)
        for tid, ks in groups.items():
            scores = list(self._judge(by_id[tid], [trajs[k].output for k in ks]))
            if len(scores) != len(ks):
                raise ValueError(f"grpo group_reward returned {len(scores)} scores for a group of {len(ks)}")
            for k, r in zip(ks, scores):
                v = float(getattr(r, "score", r))
                if v != v or v in (float("inf"), float("-inf")):
                    raise ValueError(f"grpo group_reward gave a score that is not a finite number ({v}) on task {tid}")
                out[k] = v
        return out

    def _batch(
        self, trajs: list[Trajectory], max_len: int, judged: list[float] | None = None, role: str | None = None
    ) -> tuple[list, dict[str, float]]:
        import torch

        from evolve.policy.grpo_train import pack
        from evolve.policy.rl import group_advantages
        from evolve.policy.star import ended, rejected_turns

        p = self.p
        role = role or p.role
        if p.credit_of(role) == "verdict":
            return self._verdict_batch(trajs, max_len, role)
        rewards = torch.tensor(
            [
                p.truncated_reward
                if p.truncated_reward is not None and not ended(t)
                else train_reward(t, p.reward_weights, None if judged is None else judged[k])
                for k, t in enumerate(trajs)
            ],
            dtype=torch.float32,
        )
        adv, zero = group_advantages(rewards, [t.task_id for t in trajs], p.estimator)
        if p.negative_weight != 1.0:
            adv = torch.where(adv < 0, adv * p.negative_weight, adv)
        seqs, truncated, unreinforced = [], 0, 0
        for k, (t, a, z) in enumerate(zip(trajs, adv.tolist(), zero.tolist())):
            if p.dynamic_sampling and z:
                continue
            rejected = () if p.reinforce_rejected or a <= 0 else rejected_turns(t.steps)
            unreinforced += len(rejected)
            packed = pack(t, role, max_len, context_only=rejected)
            if p.mask_truncated and any(s.truncated for s in packed):
                truncated += 1
                continue
            for s in packed:
                s.advantage, s.group, s.reward, s.traj = a, t.task_id, t.score, k
            seqs += packed
        groups = len({t.task_id for t in trajs})
        kept = len({s.group for s in seqs})
        scores = [t.score for t in trajs]
        shaped = p.reward_weights or judged or p.truncated_reward is not None
        extra = {"train_reward": round(float(rewards.mean()), 4)} if shaped and trajs else {}
        return seqs, {
            "reward": sum(scores) / len(scores) if scores else 0.0,
            **extra,
            "groups": groups,
            "groups_kept": kept,
            "truncated_dropped": truncated,
            "rejected_turns_unreinforced": unreinforced,
            "solved_all": sum(1 for g in _by_group(trajs).values() if min(g) >= 1.0) / max(groups, 1),
        }

    def _verdict_batch(self, trajs: list[Trajectory], max_len: int, role: str) -> tuple[list, dict[str, float]]:
        """A judging role's sequences: each of its calls one sample, rewarded 1 when its verdict matched
        the truth of the answer it judged; its calls on one task are a group. Calls that judged an
        answer with no score are left out."""
        import torch

        from evolve.policy.grpo_train import pack
        from evolve.policy.rl import group_advantages

        p = self.p
        turns = [v for v in verdict_turns(trajs, role, p.truth_threshold) if v.truth is not None]
        rewards = torch.tensor([v.reward for v in turns], dtype=torch.float32)
        adv, zero = (
            group_advantages(rewards, [trajs[v.traj].task_id for v in turns], p.estimator)
            if turns
            else (rewards, torch.zeros(0, dtype=torch.bool))
        )
        if p.negative_weight != 1.0:
            adv = torch.where(adv < 0, adv * p.negative_weight, adv)
        seqs, truncated = [], 0
        for k, (v, a, z) in enumerate(zip(turns, adv.tolist(), zero.tolist())):
            if p.dynamic_sampling and z:
                continue
            t = trajs[v.traj]
            packed = pack(t.model_copy(update={"steps": (t.steps[v.step],)}), role, max_len)
            if p.mask_truncated and any(s.truncated for s in packed):
                truncated += 1
                continue
            for s in packed:
                s.advantage, s.group, s.reward, s.traj = a, t.task_id, v.reward, k
            seqs += packed
        groups = {trajs[v.traj].task_id for v in turns}
        counts = verdict_counts(verdict_turns(trajs, role, p.truth_threshold))
        return seqs, {
            "reward": float(rewards.mean()) if turns else 0.0,
            "groups": len(groups),
            "groups_kept": len({s.group for s in seqs}),
            "truncated_dropped": truncated,
            "verdicts_right": counts["right"],
            "verdicts_wrong": counts["wrong"],
            "unjudged": counts["unjudged"],
        }

    def _child(
        self, parent: System, specs: dict[str, Any], adapters: dict[str, bytes], ctx: OperatorContext, step: int
    ) -> System:
        """``parent`` with each trained role's new adapter (the other roles' models as they were)."""
        models = dict(parent.models)
        for role, adapter in adapters.items():
            path = ctx.workdir / (
                f"adapter-{step:04d}.safetensors"
                if len(adapters) == 1 and self.p.roles is None
                else f"adapter-{role}-{step:04d}.safetensors"
            )
            path.write_bytes(adapter)
            ref = ctx.artifacts.put_file(path, "adapter")
            models[role] = specs[role].model_copy(update={"adapter": ref})
        return parent.replace(models=models)

    # ---------------------------------------------------------------- propose

    def _learner(self, spec: Any, ctx: OperatorContext) -> Any:
        """The :class:`~evolve.policy.grpo_train.HostedLearner` of this proposal: here, or in a Ray
        actor with ``runner.params.train``'s resources (``ctx.extra["remote"]``, the ray runner's
        trainer), where its model is loaded once and each update is a remote call."""
        from evolve.policy.grpo_train import HostedLearner
        from evolve.policy.rl import LossConfig
        from evolve.policy.sft import cold_start_examples

        p = self.p
        cfg = LossConfig(
            loss_type=p.loss_type,
            eps_low=p.eps_low,
            eps_high=p.eps_high,
            beta=p.beta,
            level=p.importance_level,
            max_completion_length=p.max_completion_length,
        )
        ptx = cold_start_examples(spec, ctx.artifacts) if p.ptx_coef > 0 else []
        if p.ptx_coef > 0 and not ptx:
            ctx.log(
                "grpo: ptx_coef > 0 but the model has no cold-start demos (sft_examples); "
                + ("the ptx term replays the policy's own successes only" if p.self_imitation else "pure GRPO")
            )
        base = str(ctx.artifacts.path(spec.base))
        init = str(ctx.artifacts.path(spec.adapter)) if spec.adapter is not None else None
        kw = dict(
            device=spec.params.get("device"),
            dtype=spec.params.get("dtype"),
            gradient_checkpointing=bool(spec.params.get("gradient_checkpointing")),
            precision=str(spec.params.get("precision", "auto")),
            cfg=cfg,
            ptx=ptx,
            ptx_coef=p.ptx_coef,
            ptx_batch=p.ptx_batch,
            r=p.r,
            alpha=p.alpha,
            lr=p.lr,
            weight_decay=p.weight_decay,
            grad_clip=p.grad_clip,
            num_iterations=p.num_iterations,
            minibatches=p.minibatches,
            micro_batch=p.micro_batch,
            micro_batch_tokens=p.micro_batch_tokens,
            seed=ctx.rng.randrange(2**31),
            warmup=p.warmup,
        )
        remote = ctx.extra.get("remote")
        if remote is None:
            return HostedLearner(base, init, **kw)
        learner = remote.actor(HostedLearner, base, init, **kw)
        ctx.log(f"grpo: the learner runs in a Ray actor on {learner.where.get('ip')} (pid {learner.where.get('pid')})")
        return learner

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
        pool = list(ctx.train)
        random.Random(f"grpo-dev/{ctx.seed}").shuffle(pool)  # the same dev tasks in every generation
        dev, pool = pool[: p.dev_tasks], pool[p.dev_tasks :]
        if not pool:
            ctx.log("grpo: no training tasks left after holding out dev_tasks")
            return []
        learners: dict[str, Any] = {}
        try:
            for role, spec in specs.items():
                learners[role] = self._learner(spec, ctx)
            return self._steps(parent, specs, ctx, learners, dev, pool)
        finally:
            for learner in learners.values():
                learner.close()

    def _steps(
        self,
        parent: System,
        specs: dict[str, Any],
        ctx: OperatorContext,
        learners: dict[str, Any],
        dev: list[dict],
        pool: list[dict],
    ) -> list[Candidate]:
        from evolve.policy.roles import verdict_examples
        from evolve.policy.star import success_turns

        p = self.p
        single = len(learners) == 1 and p.roles is None  # the curve's single-role shape, as before roles existed
        max_len = {role: learner.max_len() for role, learner in learners.items()}
        curve: list[dict[str, Any]] = []
        best: tuple[float, int, System | None] = (-math.inf, -1, None)
        current = parent
        t_start = time.perf_counter()

        def dev_eval(system: System, step: int) -> float | None:
            if not dev:
                return None
            trajs = ctx.rollouts(system, dev, samples=1, temperature=None, tag="grpo-dev")
            score = sum(t.score for t in trajs) / len(trajs)
            ctx.log(f"grpo step {step}: dev score {score:.3f} on {len(dev)} held-out training tasks")
            return score

        for step in range(p.steps + 1):
            if step % p.eval_every == 0 or step == p.steps:
                score = dev_eval(current, step)
                if score is not None and score > best[0]:
                    best = (score, step, current)
                if curve and score is not None:
                    curve[-1]["dev"] = score
                elif score is not None:
                    curve.append({"step": 0, "dev": score})
            if step == p.steps:
                break
            t0 = time.perf_counter()
            tasks = ctx.rng.sample(pool, min(p.tasks_per_step, len(pool)))
            trajs = ctx.rollouts(
                current, tasks, samples=p.group_size, temperature=p.temperature, **capped("grpo", p.max_tokens)
            )
            t_roll = time.perf_counter() - t0
            if step == 0:
                check_components(trajs, p.reward_weights)
            try:
                judged = self._judged(trajs, tasks) if p.group_reward else None
            except (ValueError, TypeError) as e:  # the judge's answer is unusable: nothing is scored from it
                ctx.log(f"grpo: the group judge failed at step {step + 1} ({e}); nothing proposed")
                return []
            rows: dict[str, dict] = {}
            for role, learner in learners.items():
                seqs, info = self._batch(trajs, max_len[role], judged, role)
                if p.self_imitation:
                    if p.credit_of(role) == "verdict":
                        wins = verdict_examples(trajs, role, p.truth_threshold, dedupe=False)[0]
                    else:
                        wins = success_turns(
                            [t for t in trajs if t.error is None and t.score >= p.imitation_threshold],
                            role,
                            "final",
                            dedupe=False,
                        )
                    info["replay_pool"] = learner.replay(wins)
                st = learner.update(seqs)
                rows[role] = {
                    **info,
                    "sequences": st.sequences,
                    "trained_tokens": st.trained_tokens,
                    "loss": st.loss,
                    "kl": st.kl,
                    "clip_low": st.clip_low,
                    "clip_high": st.clip_high,
                    "mismatch": st.mismatch,
                    **st.extra,
                    "train_s": round(st.seconds, 2),
                    "tokens_per_s": round(st.tokens / st.seconds) if st.seconds else 0,
                }
                ctx.log(
                    f"grpo step {step + 1}/{p.steps}{'' if single else ' ' + role}: reward {info['reward']:.3f}, "
                    f"{info['groups_kept']}/{info['groups']} groups with signal, {st.trained_tokens} tokens "
                    f"trained, kl {st.kl:.4f}, clip {st.clip_low + st.clip_high:.3f}, {st.seconds:.1f}s"
                )
            current = self._child(parent, specs, {r: lr.adapter_bytes() for r, lr in learners.items()}, ctx, step + 1)
            if single:
                row = {"step": step + 1, **next(iter(rows.values())), "rollout_s": round(t_roll, 2)}
            else:
                scores = [t.score for t in trajs]
                row = {
                    "step": step + 1,
                    "reward": sum(scores) / len(scores) if scores else 0.0,
                    "rollout_s": round(t_roll, 2),
                    "train_s": round(sum(r["train_s"] for r in rows.values()), 2),
                    "roles": rows,
                }
            curve.append(row)
        (ctx.workdir / "grpo_curve.json").write_text(json.dumps(curve, indent=1))
        _plot(curve, ctx.workdir / "grpo_curve.png")
        if best[2] is None:  # no dev set: the last step
            best = (math.nan, p.steps, current)
        score, step, child = best
        assert child is not None  # set above when there is no dev set
        if step == 0:
            ctx.log(f"grpo: no step beat the parent on {len(dev)} dev tasks ({score:.3f}); nothing proposed")
            return []
        where = {r: lr.where for r, lr in learners.items() if getattr(lr, "where", None)}
        summary: dict[str, Any] = {
            "steps": p.steps,
            "best_step": step,
            "dev_score": score,
            "dev_parent": curve[0].get("dev"),
            "seconds": round(time.perf_counter() - t_start, 1),
            "curve": curve,
            **(
                {"trained_in": next(iter(where.values()))}
                if where and single
                else {"trained_in": where}
                if where
                else {}
            ),
            **({} if single else {"roles": list(learners)}),
        }
        who = "" if single else f" of {', '.join(learners)}"
        why = (
            f"GRPO{who} ({p.estimator} advantages, {p.loss_type} loss, G={p.group_size}, T={p.temperature:g}) "
            f"for {step}/{p.steps} steps; dev {curve[0].get('dev', math.nan):.3f} -> {score:.3f}"
        )
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=summary)]


def train_reward(traj: Trajectory, weights: dict[str, float], base: float | None = None) -> float:
    """The task's score (or ``base``, a group judge's) plus ``weights[k]`` x the reward's component
    ``k`` (absent: 0)."""
    score = traj.score if base is None else base
    if not weights:
        return score
    comps = traj.reward.components if traj.reward is not None else {}
    return score + sum(w * float(comps.get(k, 0.0)) for k, w in weights.items())


def check_components(trajs: list[Trajectory], weights: dict[str, float]) -> None:
    """Refuse ``reward_weights`` naming a component no reward in the batch has: a misspelt name
    would otherwise add nothing, silently."""
    seen = {k for t in trajs if t.reward is not None for k in t.reward.components}
    missing = sorted(set(weights) - seen)
    if missing and trajs:
        have = ", ".join(sorted(seen)) or "none (the reward returns a bare score)"
        raise ValueError(
            f"grpo reward_weights names {', '.join(map(repr, missing))}, which no reward in the batch "
            f"has; the task's reward gives these components: {have}"
        )


def _by_group(trajs: list[Trajectory]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for t in trajs:
        out.setdefault(t.task_id, []).append(t.score)
    return out


def _plot(curve: list[dict], path: Any) -> None:
    """Train reward and dev score per step as a PNG (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    tr = [(r["step"], r["reward"]) for r in curve if "reward" in r]
    dv = [(r["step"], r["dev"]) for r in curve if "dev" in r]
    if tr:
        ax.plot(*zip(*tr), label="train reward (sampled)", lw=1.2)
    if dv:
        ax.plot(*zip(*dv), "o-", label="dev score (greedy, held-out train tasks)", lw=1.5)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
