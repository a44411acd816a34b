"""Known answers for the GRPO family's math (policy/rl.py), and a cross-check against TRL."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from evolve.policy.rl import (  # noqa: E402
    LossConfig,
    group_advantages,
    k3,
    policy_loss,
    token_logprobs,
)

DATA = Path(__file__).parents[1] / "data"


# ----------------------------------------------------------------------------- advantages


def test_advantages_under_each_estimator():
    r = [1, 0, 0, 1, 1, 1, 1, 1]
    g = ["a"] * 4 + ["b"] * 4
    std_a = math.sqrt(1 / 3)  # Bessel-corrected std of (1, 0, 0, 1)
    adv, zero = group_advantages(r, g, "grpo")
    assert adv[:4].tolist() == pytest.approx(
        [0.5 / (std_a + 1e-4), -0.5 / (std_a + 1e-4)] * 1 + [-0.5 / (std_a + 1e-4), 0.5 / (std_a + 1e-4)], rel=1e-6
    )
    assert adv[4:].tolist() == [0, 0, 0, 0] and zero.tolist() == [False] * 4 + [True] * 4
    adv, _ = group_advantages(r, g, "dr_grpo")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    adv, _ = group_advantages(r, g, "rloo")  # r_i minus the mean of the other three
    assert adv.tolist() == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0, 0, 0, 0])
    adv, _ = group_advantages(r, g, "batch")  # group mean, std of all eight rewards
    std_all = math.sqrt(1.5 / 7)
    assert adv.tolist() == pytest.approx(
        [0.5 / (std_all + 1e-4), -0.5 / (std_all + 1e-4), -0.5 / (std_all + 1e-4), 0.5 / (std_all + 1e-4), 0, 0, 0, 0],
        rel=1e-6,
    )
    adv, zero = group_advantages(r, g, "reinforce_pp")  # batch mean 0.75 and std: the all-1 group is signal too
    one, nil = 0.25 / (std_all + 1e-4), -0.75 / (std_all + 1e-4)
    assert adv.tolist() == pytest.approx([one, nil, nil, one, one, one, one, one], rel=1e-6)
    assert zero.tolist() == [False] * 8
    assert group_advantages([1, 1, 1], ["a", "b", "c"], "reinforce_pp")[1].tolist() == [True] * 3


def test_advantages_groups_need_not_be_contiguous_and_bad_input_is_named():
    adv, _ = group_advantages([1.0, 0.0, 0.0, 1.0], ["x", "y", "x", "y"], "dr_grpo")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])
    adv, zero = group_advantages([0.3], ["solo"], "rloo")
    assert adv.tolist() == [0.0] and zero.tolist() == [True]
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        group_advantages([1.0, 0.0], [0, 0], "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="3 rewards but 2 group labels"):
        group_advantages([1.0, 0.0, 1.0], [0, 0])


# ----------------------------------------------------------------------------- the loss


def _logits(B=3, T=5, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64).requires_grad_(True)
    targets = torch.randint(0, V, (B, T), generator=g)
    return logits, targets


def test_on_policy_loss_is_zero_and_its_gradient_is_reinforce():
    logits, targets = _logits()
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -0.25, -0.75], dtype=torch.float64)  # sums to zero, as group advantages do
    for loss_type in ("grpo", "dapo", "bnpo", "dr_grpo"):
        logp = token_logprobs(logits, targets, temperature=0.7)
        loss, _ = policy_loss(logp, logp.detach(), adv, mask, LossConfig(loss_type=loss_type))
        (g_ours,) = torch.autograd.grad(loss, logits)
        # REINFORCE with the same aggregation: -sum A_i * logp_it, weighted per loss type
        logp2 = token_logprobs(logits, targets, temperature=0.7)
        w = {
            "grpo": 1 / (mask.sum(-1, keepdim=True) * 3),
            "dapo": 1 / mask.sum(),
            "bnpo": 1 / mask.sum(),
            "dr_grpo": torch.tensor(1 / (3 * 5)),
        }[loss_type]
        reinforce = -(adv[:, None] * logp2 * mask * w).sum()
        (g_ref,) = torch.autograd.grad(reinforce, logits)
        assert torch.allclose(g_ours, g_ref, atol=1e-12), loss_type
        if loss_type == "grpo":  # sequence means of ratio 1 times zero-sum advantages
            assert abs(float(loss.detach())) < 1e-12


@pytest.mark.parametrize(
    "ratio,adv,zero_grad",
    [
        (1.5, 1.0, True),  # A > 0, ratio above 1 + eps_high: clipped, no gradient
        (0.5, -1.0, True),  # A < 0, ratio below 1 - eps_low: clipped, no gradient
        (1.5, -1.0, False),  # A < 0, ratio above the range: the pessimistic (unclipped) term, gradient flows
        (0.5, 1.0, False),  # A > 0, ratio below the range: unclipped, gradient flows
        (1.25, 1.0, False),  # inside the asymmetric range (1 + 0.28): not clipped
        (0.79, -1.0, True),  # just below 1 - 0.2
    ],
)
def test_clip_cases(ratio, adv, zero_grad):
    old = torch.tensor([[-1.0]], dtype=torch.float64)
    logp = (old + math.log(ratio)).clone().requires_grad_(True)
    loss, stats = policy_loss(
        logp,
        old,
        torch.tensor([adv], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        LossConfig(eps_low=0.2, eps_high=0.28),
    )
    (g,) = torch.autograd.grad(loss, logp)
    if zero_grad:
        assert g.item() == 0.0 and stats["clip_low"] + stats["clip_high"] == 1.0
    else:
        assert g.item() == pytest.approx(-adv * ratio)  # d(-ratio * A)/d logp


def test_k3_at_a_known_log_ratio():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])  # log(ref/pi) = -0.5
    assert k3(logp, ref).item() == pytest.approx(math.exp(-0.5) + 0.5 - 1, abs=1e-7)
    assert k3(ref, ref).item() == 0.0
    # it is an unbiased estimate of KL(pi || ref): average over samples of pi
    g = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.3, 0.2])
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = k3(p.log()[x], q.log()[x]).mean().item()
    assert est == pytest.approx(float((p * (p / q).log()).sum()), abs=2e-3)


def test_gspo_sequence_ratio_is_the_geometric_mean_over_trained_tokens():
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3, 5.0]], dtype=torch.float64)  # the third position is masked (a tool token)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    _, stats = policy_loss(
        logp, old, torch.tensor([1.0], dtype=torch.float64), mask, LossConfig(level="sequence", eps_high=1.0)
    )
    assert stats["ratio_mean"] == pytest.approx(math.exp(0.2))
    loss, _ = policy_loss(
        logp,
        old,
        torch.tensor([1.0], dtype=torch.float64),
        mask,
        LossConfig(level="sequence", eps_high=1.0, loss_type="grpo"),
    )
    assert float(loss) == pytest.approx(-math.exp(0.2))


def test_masked_tool_tokens_get_no_gradient_and_change_nothing():
    logits, targets = _logits(B=2, T=6)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 0, 1, 0]], dtype=torch.float64)  # 0 = tool output / user text
    adv = torch.tensor([0.8, -0.6], dtype=torch.float64)
    old = token_logprobs(logits, targets).detach() + 0.05
    cfg = LossConfig(beta=0.1)
    ref = old - 0.1

    def loss_for(tg):
        return policy_loss(token_logprobs(logits, tg), old, adv, mask, cfg, ref_logp=ref)[0]

    (g1,) = torch.autograd.grad(loss_for(targets), logits)
    assert torch.count_nonzero(g1[mask == 0]) == 0  # no gradient at any position that predicts a tool token
    changed = targets.clone()
    changed[mask == 0] = (changed[mask == 0] + 3) % logits.shape[-1]  # different tool tokens as targets
    (g2,) = torch.autograd.grad(loss_for(changed), logits)
    assert torch.equal(g1, g2)


def test_dapo_loss_splits_over_micro_batches_exactly():
    logits, targets = _logits(B=4, T=5, seed=3)
    mask = (torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) > 0.3).double()
    adv = torch.tensor([0.5, -1.0, 1.5, -1.0], dtype=torch.float64)
    old = token_logprobs(logits, targets).detach() + 0.1
    for lt in ("dapo", "grpo", "dr_grpo"):
        cfg = LossConfig(loss_type=lt, max_completion_length=5)
        full, _ = policy_loss(token_logprobs(logits, targets), old, adv, mask, cfg)
        parts = sum(
            policy_loss(
                token_logprobs(logits[i : i + 2], targets[i : i + 2]),
                old[i : i + 2],
                adv[i : i + 2],
                mask[i : i + 2],
                cfg,
                num_seqs=4,
                num_tokens=float(mask.sum()),
            )[0]
            for i in (0, 2)
        )
        assert float(parts.detach()) == pytest.approx(float(full.detach()), abs=1e-12), lt


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        LossConfig(loss_type="ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), LossConfig(beta=0.1))


def test_temperature_is_applied_before_the_softmax():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    lp = token_logprobs(logits, torch.tensor([[0]]), temperature=0.5)
    assert lp.item() == pytest.approx(torch.log_softmax(logits / 0.5, -1)[0, 0, 0].item())
    assert token_logprobs(logits, torch.tensor([[0]]), temperature=0.0).item() == pytest.approx(
        torch.log_softmax(logits, -1)[0, 0, 0].item()
    )  # greedy draws report untempered log-probs


# ----------------------------------------------------------------------------- TRL


def _ours(case: dict, t: dict, eps_low: float, eps_high: float, max_len: int):
    logp = t["logp"].clone().requires_grad_(True)
    old = t["old"] if case["off_policy"] else logp.detach()
    cfg = LossConfig(
        loss_type=case["loss_type"],
        level=case["level"],
        beta=case["beta"],
        eps_low=eps_low,
        eps_high=eps_high,
        max_completion_length=max_len,
    )
    loss, _ = policy_loss(logp, old, t["adv"], t["mask"], cfg, ref_logp=t["ref"])
    loss.backward()
    return float(loss), logp.grad


def test_matches_trl_grpo_loss_and_gradients_on_identical_tensors():
    """Recorded by tests/helpers/trl_reference.py from TRL's own GRPOTrainer._compute_loss."""
    ref = json.loads((DATA / "trl_grpo_reference.json").read_text())
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in ref["tensors"].items()}
    assert len(ref["cases"]) == 32
    for case in ref["cases"]:
        loss, grad = _ours(case, t, ref["eps_low"], ref["eps_high"], ref["max_completion_length"])
        assert loss == pytest.approx(case["loss"], abs=1e-12), case
        assert torch.allclose(grad, torch.tensor(case["grad"], dtype=torch.float64), atol=1e-12), case


def test_matches_live_trl_when_installed():
    pytest.importorskip("trl", reason="TRL is not installed here; the recorded reference is checked instead")
    mod = runpy.run_path(str(Path(__file__).parents[1] / "helpers" / "trl_reference.py"))
    t = mod["tensors"](seed=7)
    for case in mod["CASES"]:
        loss, grad = mod["trl_loss"](case, t)
        ours, g = _ours(case, t, mod["EPS_LOW"], mod["EPS_HIGH"], mod["MAX_COMPLETION"])
        assert ours == pytest.approx(loss, abs=1e-12), case
        assert torch.allclose(g, torch.tensor(grad, dtype=torch.float64), atol=1e-12), case


def test_grpo_weights_a_trajectory_split_into_two_sequences_as_one_sample():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -0.1]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)  # 3 trained tokens in all
    old = logp - 0.1
    adv = torch.tensor([0.7, 0.7], dtype=torch.float64)  # one trajectory, one advantage
    split, _ = policy_loss(
        logp,
        old,
        adv,
        mask,
        LossConfig(loss_type="grpo"),
        num_seqs=1,
        seq_weights=torch.tensor([1 / 3, 1 / 3], dtype=torch.float64),
    )
    merged, _ = policy_loss(
        torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64),
        torch.tensor([[-1.1, -2.1, -0.4]], dtype=torch.float64),
        adv[:1],
        torch.ones(1, 3, dtype=torch.float64),
        LossConfig(loss_type="grpo"),
    )
    assert float(split) == pytest.approx(float(merged))
