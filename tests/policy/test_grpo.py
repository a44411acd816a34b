"""GRPO on recorded trajectories: packing without re-tokenising, LoRA without drift, learning, the operator."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.policy.grpo_train import Learner, Packed, pack  # noqa: E402
from evolve.policy.rl import LossConfig, group_advantages  # noqa: E402
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model, sample  # noqa: E402
from evolve.policy.weights import attach_adapter, load_base, read_adapter, save_base  # noqa: E402
from evolve.types import LLMCall, Message, Reward, ToolCall, Trajectory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOK = CharTokenizer()
SMALL = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64)
M = (Message(role="user", content="q"),)


def call(prompt, out, lps=None, temperature=1.0, finish="stop", role="policy"):
    return LLMCall(
        role=role,
        model="tiny",
        messages=M,
        output="x",
        prompt_token_ids=prompt,
        token_ids=out,
        logprobs=lps or tuple(-0.5 for _ in out),
        temperature=temperature,
        finish_reason=finish,
    )


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------- packing


def test_pack_merges_turns_and_masks_everything_the_model_did_not_sample():
    # ids chosen so they would not survive a decode/encode round trip: packing must not re-tokenise
    t = Trajectory(
        task_id="t",
        system_id="s",
        reward=Reward(score=1),
        steps=(
            call((1, 50, 51), (60, 61, 2)),
            ToolCall(name="run", result="rows"),
            call((1, 50, 51, 60, 61, 2, 70, 71), (62, 2)),  # prompt = previous transcript + tool output 70 71
            call((1, 99), (63,), finish="length"),  # a fresh context: a new sequence
            call((1, 5), (9,), role="judge"),  # another role: not this policy's tokens
        ),
    )
    a, b = pack(t)
    assert a.ids == [1, 50, 51, 60, 61, 2, 70, 71, 62, 2]
    assert a.mask == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert [math.isnan(x) for x in a.sampler_logp] == [m == 0 for m in a.mask]
    assert not a.truncated
    assert b.ids == [1, 99, 63] and b.mask == [0, 0, 1] and b.truncated
    # the context window: a merge that would not fit starts a new sequence instead
    assert len(pack(t, max_len=9)) == 3


def test_pack_keeps_turns_at_different_temperatures_apart():
    t = Trajectory(
        task_id="t", system_id="s", steps=(call((1,), (5,), temperature=1.0), call((1, 5, 7), (6,), temperature=0.5))
    )
    assert [p.temperature for p in pack(t)] == [1.0, 0.5]


# ----------------------------------------------------------------------------- LoRA without drift


@pytest.mark.slow
def test_fresh_adapter_reproduces_the_base_exactly_and_the_base_never_changes():
    base = build_model(SMALL, seed=1)
    before = state(base)
    x = torch.randint(4, 60, (3, 12))
    with torch.no_grad():
        ref = base(input_ids=x).logits.clone()
    learner = Learner(base, lr=5e-2, seed=0)
    with torch.no_grad():
        assert torch.equal(learner.model(input_ids=x).logits, ref)  # B = 0: exactly the base
    seqs = [
        Packed(ids=[1, 7, 8, 9, 10], mask=[0, 0, 1, 1, 1], sampler_logp=[math.nan] * 5, temperature=1.0, advantage=a)
        for a in (1.0, -1.0)
    ]
    seqs[1].ids = [1, 7, 11, 12, 13]
    for _ in range(3):
        learner.update(seqs)
    with torch.no_grad():
        assert not torch.equal(learner.model(input_ids=x).logits, ref)  # the adapter learned something
        with learner.model.disable_adapter():  # the reference policy: the base, bit for bit
            assert torch.equal(learner.model(input_ids=x).logits, ref)
    after = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v
        for k, v in learner.model.state_dict().items()
        if "lora_" not in k
    }
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.slow
def test_an_archived_adapter_restores_exactly(tmp_path):
    base = build_model(SMALL, seed=2)
    save_base(base, TOK, SMALL, tmp_path / "base.safetensors")
    learner = Learner(load_base(tmp_path / "base.safetensors")[0], lr=5e-2, seed=0)
    learner.update(
        [Packed(ids=[1, 7, 8, 9], mask=[0, 1, 1, 1], sampler_logp=[math.nan] * 4, temperature=1.0, advantage=1.0)]
    )
    learner.adapter().save(tmp_path / "a.safetensors")
    fresh = attach_adapter(load_base(tmp_path / "base.safetensors")[0], read_adapter(tmp_path / "a.safetensors"))
    x = torch.randint(4, 60, (2, 9))
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=x).logits, learner.model.eval()(input_ids=x).logits)


# ----------------------------------------------------------------------------- learning


VOWELS = set(TOK.encode("aeiou"))


def _learn(seed: int, steps: int, temperature: float = 1.0, **kw) -> tuple[list[float], list]:
    learner = Learner(build_model(SMALL, seed=seed), r=8, alpha=16, lr=2e-2, seed=seed, **kw)
    prompts = [TOK.render_chat([Message(role="user", content=c)]) for c in "wxyz"]
    G, hist, stats = 16, [], []
    for step in range(steps):
        ps = [p for p in prompts for _ in range(G)]
        learner.model.eval()
        out = sample(
            learner.model,
            ps,
            eos_id=TOK.eos_id,
            temperatures=temperature,
            max_tokens=4,
            seeds=[seed * 10**6 + step * 1000 + i for i in range(len(ps))],
        )
        learner.model.train()
        r = [sum(t in VOWELS for t in s.token_ids[:4]) / 4 for s in out]
        adv, _ = group_advantages(r, [i // G for i in range(len(ps))])
        seqs = [
            Packed(
                ids=list(p) + list(s.token_ids),
                mask=[0] * len(p) + [1] * len(s.token_ids),
                sampler_logp=[math.nan] * len(p) + list(s.logprobs),
                temperature=temperature,
                advantage=a,
            )
            for p, s, a in zip(ps, out, adv.tolist())
        ]
        stats.append(learner.update(seqs))
        hist.append(sum(r) / len(r))
    return hist, stats


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_init_model_learns_a_rewarded_behaviour_under_lora(seed):
    hist, stats = _learn(seed, steps=15, temperature=0.8)
    assert hist[0] < 0.2 and min(hist[-3:]) > 0.9, hist
    # the trainer's log-probs of the sampled ids equal the sampler's: same ids, same temperature
    assert max(s.mismatch for s in stats) < 1e-4


@pytest.mark.slow
def test_several_iterations_use_stored_old_logprobs_and_clip():
    _, stats = _learn(0, steps=3, num_iterations=4, cfg=LossConfig(eps_low=0.05, eps_high=0.05))
    assert all(s.optimizer_steps == 4 for s in stats)
    assert max(s.clip_low + s.clip_high for s in stats) > 0  # later passes move the ratio past the clip range
    assert stats[0].mismatch < 1e-4  # stored old log-probs = the sampler's


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo"])
def test_a_token_budget_splits_the_forward_passes_but_not_the_gradient(loss_type):
    """``micro_batch_tokens`` is memory only: a step split into many small passes moves the adapter
    exactly as one pass of everything does (plain SGD at lr 1, so the move is the gradient)."""
    rng = torch.Generator().manual_seed(4)
    seqs = []
    for i, n in enumerate((6, 9, 12, 15, 20, 24, 30, 31)):
        ids = torch.randint(4, 60, (n,), generator=rng).tolist()
        seqs.append(
            Packed(
                ids=ids,
                mask=[0] * 4 + [1] * (n - 4),
                sampler_logp=[math.nan] * n,
                temperature=1.0,
                advantage=(1.0, -0.5, 2.0, -1.5)[i % 4],
                traj=i,
            )
        )

    def moved(budget):
        learner = Learner(
            build_model(SMALL, seed=2),
            r=8,
            alpha=16,
            seed=0,
            grad_clip=0.0,
            micro_batch_tokens=budget,
            cfg=LossConfig(loss_type=loss_type),
        )
        learner.opt = torch.optim.SGD(learner.params, lr=1.0)
        passes = [tuple(b["input_ids"].shape) for b in learner._micro(seqs)]
        before = [p.detach().clone() for p in learner.params]
        learner.update(seqs)
        return passes, [b - p.detach() for b, p in zip(before, learner.params)]

    one, whole = moved(0)  # no cap: one pass
    many, split = moved(48)
    assert one == [(8, 30)]  # inputs are the ids less the last
    assert len(many) >= 4 and all(rows * (cols + 1) <= 48 or rows == 1 for rows, cols in many), many
    assert sum(rows for rows, _ in many) == 8
    assert any(float(d.abs().max()) > 1e-4 for d in whole)  # the step moved the adapter
    for a, b in zip(whole, split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_default_token_budget_follows_the_models_shape():
    from evolve.policy.grpo_train import auto_micro_tokens

    small, wide = (
        build_model(SMALL, seed=0),
        build_model(TinyConfig(d_model=256, n_layers=8, n_heads=4, d_ff=1024), seed=0),
    )
    assert auto_micro_tokens(wide) < auto_micro_tokens(small)
    assert auto_micro_tokens(wide, gib=1.0) == pytest.approx(auto_micro_tokens(wide) / 4, rel=0.01)
    assert Learner(wide, seed=0).micro_batch_tokens == auto_micro_tokens(wide)
    assert Learner(wide, seed=0, micro_batch_tokens=0).micro_batch_tokens is None  # 0: no cap


# ----------------------------------------------------------------------------- the operator in the engine


def _vowel_task(tmp_path, **params):
    save_base(build_model(SMALL, seed=5), TOK, SMALL, tmp_path / "base.safetensors")
    return {
        "name": "vowels",
        "seed": 0,
        "agent": "tests.helpers.agents:vowel_agent",
        "reward": "tests.helpers.agents:vowel_reward",
        "models": {
            "policy": {
                "backend": "local",
                "name": "tiny",
                "params": {"weights": str(tmp_path / "base.safetensors"), "temperature": 0.0, "max_tokens": 4},
            }
        },
        "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
        "operators": [
            {
                "name": "grpo",
                "params": {
                    "steps": 8,
                    "tasks_per_step": 4,
                    "group_size": 8,
                    "lr": 0.02,
                    "r": 8,
                    "dev_tasks": 8,
                    "eval_every": 4,
                    **params,
                },
            }
        ],
        "runner": {"name": "thread", "workers": 16, "timeout": 60},
        "budget": {"generations": 1},
        "engine": {"minibatch": 8},
    }


@pytest.mark.slow
def test_grpo_operator_in_an_evolution_run(tmp_path):
    report = evolve.run(_vowel_task(tmp_path), out=tmp_path / "run")
    a = Archive(tmp_path / "run", create=False)
    kids = [r for r in a.records() if r.operator == "grpo"]
    assert len(kids) == 1
    info = kids[0].info
    curve = info["curve"]
    assert [r["step"] for r in curve] == list(range(9)) and info["dev_score"] > info["dev_parent"]
    assert all(r["mismatch"] < 1e-4 for r in curve[1:])
    assert (tmp_path / "run" / "work").exists() and list((tmp_path / "run" / "work").glob("*/grpo_curve.json"))
    child = a.get_system(kids[0].id)
    parent = a.get_system(kids[0].parents[0])
    assert child.models["policy"].base == parent.models["policy"].base  # same base, new adapter
    assert child.models["policy"].adapter is not None and parent.models["policy"].adapter is None
    # the rollouts GRPO trained on are in the archive, with the exact token ids and log-probs
    trajs = [t for t in a.trajectories(split="train") if len(t.steps) == 2]
    assert trajs and all(s.token_ids and s.logprobs for t in trajs for s in t.steps)
    assert report["best"]["val"]["score"] >= report["baseline"]["val"]["score"]


@pytest.mark.slow
def test_ptx_term_pulls_the_policy_toward_the_demos():
    """PPO-ptx: with only the SFT term (advantages 0), the demo completions become likelier."""
    from evolve.policy.train import completion_loss

    demos = [((1, 7, 8), (20, 21, 22, 2)), ((1, 9, 8), (23, 24, 2))]
    learner = Learner(build_model(SMALL, seed=4), lr=2e-2, seed=0, ptx=demos, ptx_coef=1.0, ptx_batch=2)
    before = completion_loss(learner.model, demos)
    zero_adv = [Packed(ids=[1, 7, 30, 31], mask=[0, 0, 1, 1], sampler_logp=[math.nan] * 4, temperature=1.0)]
    for _ in range(10):
        st = learner.update(zero_adv)
    assert completion_loss(learner.model, demos) < before - 0.5 and st.extra["ptx_nll"] > 0
    # advantages 0: the policy-gradient term adds no gradient, so the whole norm is PPO-ptx's
    assert st.extra["pg_grad_norm"] == 0.0 and st.extra["grad_norm"] > 0
    zero_adv[0].advantage = 1.0
    assert learner.update(zero_adv).extra["pg_grad_norm"] > 0


def test_batch_drops_groups_without_signal_and_optionally_truncated_trajectories():
    from evolve.policy.grpo import GRPO

    def t(task, score, finish="stop"):
        return Trajectory(
            task_id=task,
            system_id="s",
            reward=Reward(score=score),
            steps=(call((1, 2), (5, 6), finish=finish), ToolCall(name="run", result=1)),
        )

    trajs = [t("a", 1.0), t("a", 0.0, finish="length"), t("b", 1.0), t("b", 1.0), t("c", 0.0), t("c", 0.0)]
    seqs, info = GRPO()._batch(trajs, 64)
    assert [s.group for s in seqs] == ["a", "a"] and info["groups_kept"] == 1 and info["groups"] == 3
    assert seqs[0].advantage > 0 > seqs[1].advantage and [s.traj for s in seqs] == [0, 1]
    seqs, info = GRPO(mask_truncated=True)._batch(trajs, 64)
    assert [s.reward for s in seqs] == [1.0] and info["truncated_dropped"] == 1
    seqs, _ = GRPO(dynamic_sampling=False)._batch(trajs, 64)
    assert len(seqs) == 6 and all(s.advantage == 0 for s in seqs if s.group in ("b", "c"))
    # DAPO's overlong punishment: a reply cut at the cap is trained as scoring truncated_reward, so a
    # group whose cut reply scored as high as the finished one now has signal, and the cut one is pushed down
    trajs = [t("d", 0.5), t("d", 0.5, finish="length"), t("e", 1.0), t("e", 1.0)]
    assert GRPO()._batch(trajs, 64)[1]["groups_kept"] == 0
    seqs, info = GRPO(truncated_reward=0.0)._batch(trajs, 64)
    assert [s.traj for s in seqs] == [0, 1] and seqs[0].advantage > 0 > seqs[1].advantage
    assert info["train_reward"] == 0.625 and info["reward"] == 0.75  # the reported reward stays the score


def test_rejected_turns_of_a_successful_attempt_can_stay_context():
    """reinforce_rejected=False: a first query the database rejected, in an attempt that then
    succeeded, is not pushed up; its retry is; a failed attempt is pushed down on every turn."""
    from evolve.policy.grpo import GRPO

    def t(score, first_error):
        return Trajectory(
            task_id="a",
            system_id="s",
            reward=Reward(score=score),
            steps=(
                call((1, 2), (5, 6)),
                ToolCall(name="sql", error=first_error),
                call((1, 2, 5, 6, 9), (7, 8)),
                ToolCall(name="sql", result=1),
            ),
        )

    trajs = [t(1.0, "no such column"), t(0.0, "syntax error")]
    seqs, info = GRPO()._batch(trajs, 64)
    assert [s.mask for s in seqs] == [[0, 0, 1, 1, 0, 1, 1]] * 2 and info["rejected_turns_unreinforced"] == 0
    seqs, info = GRPO(reinforce_rejected=False)._batch(trajs, 64)
    assert seqs[0].advantage > 0 and seqs[0].mask == [0, 0, 0, 0, 0, 1, 1] and seqs[0].traj_tokens == 2
    assert seqs[1].advantage < 0 and seqs[1].mask == [0, 0, 1, 1, 0, 1, 1]
    assert info["rejected_turns_unreinforced"] == 1


def test_negative_weight_scales_only_the_below_average_attempts():
    from evolve.policy.grpo import GRPO

    def t(task, score):
        return Trajectory(task_id=task, system_id="s", reward=Reward(score=score), steps=(call((1, 2), (5, 6)),))

    trajs = [t("a", 1.0), t("a", 0.0), t("a", 0.0)]
    full = [s.advantage for s in GRPO()._batch(trajs, 64)[0]]
    assert full[0] > 0 > full[1] == full[2]
    quarter = [s.advantage for s in GRPO(negative_weight=0.25)._batch(trajs, 64)[0]]
    assert quarter == pytest.approx([full[0], full[1] / 4, full[2] / 4])
    assert [s.advantage for s in GRPO(negative_weight=0)._batch(trajs, 64)[0]] == pytest.approx([full[0], 0, 0])


def test_the_dry_run_estimate_counts_every_grpo_rollout():
    from types import SimpleNamespace

    from evolve.policy.grpo import GRPO

    # examples/sql_agent/grpo.yaml: 2 steps x 1,500 tasks x G=3, dev checks at steps 0..2 on 200 tasks
    op = GRPO(steps=2, tasks_per_step=1500, group_size=3, dev_tasks=200, eval_every=1)
    assert op.estimate(SimpleNamespace(train=5000)) == {
        "rollouts": 2 * 1500 * 3 + 3 * 200,
        "llm_calls": 0,
        "children": 1,
    }
    op = GRPO(steps=4, tasks_per_step=256, group_size=8, dev_tasks=200, eval_every=1)
    assert op.estimate(SimpleNamespace(train=5000))["rollouts"] == 4 * 256 * 8 + 5 * 200
    # checks at 0, 5, 10 and the last step 12; few training tasks cap both parts
    op = GRPO(steps=12, tasks_per_step=32, group_size=4, dev_tasks=50, eval_every=5)
    assert op.estimate(SimpleNamespace(train=60))["rollouts"] == 12 * 10 * 4 + 4 * 50


def test_reward_weights_add_named_components_to_the_training_reward_only():
    from evolve.policy.grpo import GRPO, check_components

    def t(task, score, executes):
        return Trajectory(
            task_id=task,
            system_id="s",
            steps=(call((1, 2), (5, 6)),),
            reward=Reward(score=score, components={"executes": executes, "matches": score}),
        )

    # group "a": all wrong, one ran: signal only with the executes term; "b": equal rewards either way
    trajs = [t("a", 0.0, 1.0), t("a", 0.0, 0.0), t("b", 1.0, 1.0), t("b", 1.0, 1.0)]
    seqs, info = GRPO()._batch(trajs, 64)
    assert seqs == [] and info["groups_kept"] == 0 and "train_reward" not in info
    seqs, info = GRPO(reward_weights={"executes": 0.25})._batch(trajs, 64)
    assert [s.group for s in seqs] == ["a", "a"] and seqs[0].advantage > 0 > seqs[1].advantage
    assert info["reward"] == 0.5 and info["train_reward"] == pytest.approx((0.25 + 0 + 1.25 + 1.25) / 4)
    assert [s.reward for s in seqs] == [0.0, 0.0]  # the task's score is what is reported
    check_components(trajs, {"executes": 0.25})
    with pytest.raises(ValueError, match=r"'execute'.*executes, matches"):
        check_components(trajs, {"execute": 0.25})


JUDGED: list[list] = []


class RankingJudge:
    """A RULER-style judge: one call per group, "good" answers above the rest."""

    def rank(self, task, outputs):
        JUDGED.append([task["id"], *outputs])
        return [Reward(score=0.9 if o == "good" else 0.2) for o in outputs]


judge = RankingJudge()


def test_a_group_judge_ranks_each_group_in_one_call_and_its_scores_drive_the_advantages():
    from evolve.policy.grpo import GRPO

    def t(task, out, score=0.0, error=None):
        return Trajectory(
            task_id=task,
            system_id="s",
            steps=(call((1, 2), (5, 6)),),
            output=out,
            reward=Reward(score=score),
            error=error,
        )

    # the task's reward sees no difference in group "a" (all 0): the judge does
    trajs = [t("a", "good"), t("a", "meh"), t("a", "good", error="crashed"), t("b", "meh", 1.0), t("b", "meh", 1.0)]
    op = GRPO(group_reward="tests.policy.test_grpo:judge")
    JUDGED.clear()
    judged = op._judged(trajs, [{"id": "a"}, {"id": "b"}])
    assert JUDGED == [["a", "good", "meh"], ["b", "meh", "meh"]]  # the crashed rollout is not shown
    assert judged == [0.9, 0.2, 0.0, 0.2, 0.2]
    seqs, info = op._batch(trajs, 64, judged)
    assert [s.traj for s in seqs] == [0, 1, 2] and seqs[0].advantage > 0 > seqs[1].advantage
    assert [s.reward for s in seqs] == [0.0, 0.0, 0.0] and info["train_reward"] == pytest.approx(1.5 / 5)
    assert GRPO()._batch(trajs[:3], 64)[0] == []  # without the judge group "a" has no signal
    with pytest.raises(ValueError, match="2 scores for a group of 3"):
        GRPO(group_reward="tests.policy.test_grpo:judge_short")._judged(trajs[:3] + [t("a", "x")], [{"id": "a"}])


def judge_short(task, outputs):
    return [0.5, 0.5]


@pytest.mark.slow
def test_warmup_scales_the_first_optimiser_steps():
    # Adam's first step moves each parameter by about lr (|m/sqrt(v)| = 1), so the largest change
    # after one step reads the learning rate it used: lr/4, then 2lr/4, ... with warmup=4
    seqs = [
        Packed(
            ids=[1, 5, 6, 7],
            mask=[0, 1, 1, 1],
            sampler_logp=[math.nan] + [-1.0] * 3,
            temperature=1.0,
            advantage=a,
            traj=i,
        )
        for i, a in enumerate((1.0, -1.0))
    ]
    seqs[1].ids = [1, 7, 6, 5]

    def first_step(warmup):
        learner = Learner(build_model(SMALL, seed=3), lr=1e-2, seed=0, warmup=warmup)
        before = [p.detach().clone() for p in learner.params]
        st = learner.update(seqs)
        return max(float((p.detach() - b).abs().max()) for p, b in zip(learner.params, before)), st.extra["lr"]

    moved, lr_next = first_step(0)
    assert moved == pytest.approx(1e-2, rel=0.05) and lr_next == 1e-2
    moved, lr_next = first_step(4)
    assert moved == pytest.approx(1e-2 / 4, rel=0.05) and lr_next == pytest.approx(1e-2 / 2)


@pytest.mark.slow
def test_self_imitation_replays_the_policys_successes_through_the_ptx_term(tmp_path):
    from evolve.policy.grpo import GRPO

    with pytest.raises(ValueError, match="ptx_coef > 0"):
        GRPO(self_imitation=True)
    # the base has no cold-start demos, so the ptx term can only run on replayed successes
    evolve.run(
        _vowel_task(tmp_path, steps=3, self_imitation=True, ptx_coef=1.0, imitation_threshold=0.25),
        out=tmp_path / "run",
    )
    # read the curve the operator writes whether or not a step beat the parent on dev (a child is
    # proposed only then, and 3 steps on this toy are too few to count on it)
    (path,) = (tmp_path / "run" / "work").glob("*/grpo_curve.json")
    curve = json.loads(path.read_text())[1:]
    assert [r["step"] for r in curve] == [1, 2, 3]
    pools = [r["replay_pool"] for r in curve]
    assert pools[-1] > 0 and pools == sorted(pools)
    assert all(("ptx_nll" in r) == (n > 0) for r, n in zip(curve, pools))  # the term runs once successes exist


def test_its_samples_take_the_token_cap():
    """``max_tokens`` caps GRPO's sampled groups (under their own tag), not its greedy dev scoring."""
    import random
    from types import SimpleNamespace

    from evolve.policy.grpo import GRPO

    class Sampled(Exception):
        pass

    asked: list[dict] = []

    def rollouts(system, tasks, **k):
        asked.append(k)
        if k["tag"] != "grpo-dev":
            raise Sampled
        return []

    ctx = SimpleNamespace(rng=random.Random(0), log=lambda m: None, rollouts=rollouts, seed=0)
    learner = SimpleNamespace(max_len=lambda: 99)
    for cap, tag, extra in [(32, "grpo@32", {"max_tokens": 32}), (None, "grpo", {})]:
        asked.clear()
        with pytest.raises(Sampled):
            GRPO(max_tokens=cap, steps=1, group_size=2)._steps(None, {}, ctx, {"policy": learner}, [], [{"id": "t"}])
        assert asked[-1] == {"samples": 2, "temperature": 1.0, "tag": tag, **extra}
