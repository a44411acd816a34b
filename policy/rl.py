"""The GRPO family's math, as plain tensor functions (no trainer, no model wrapper).

Everything the :class:`~evolve.policy.grpo.GRPO` operator optimises is here, so each piece can
be tested against known answers and against TRL on identical tensors:

* :func:`group_advantages` — one scalar advantage per rollout from the rewards of its group:
  ``grpo`` (group mean and std), ``dr_grpo`` (group mean, no std: Dr. GRPO), ``batch`` (group
  mean, std of the whole batch: TRL's ``scale_rewards="batch"``), ``rloo`` (leave-one-out
  baseline), ``reinforce_pp`` (REINFORCE++'s global baseline: batch mean and std, no group
  baseline, so a group whose rollouts all succeeded or all failed still carries signal: Hu et
  al., 2025, arXiv:2501.03262). Standard deviations are Bessel-corrected and get ``eps`` added,
  as in TRL.
* :func:`token_logprobs` — ``log_softmax(logits / T)`` of the next tokens: the same temperature
  the sampler applied (:func:`evolve.policy.tiny.sample`), so ratios compare like with like.
* :func:`k3` — Schulman's unbiased, always-positive KL estimator ``exp(q - p) - (q - p) - 1``.
* :func:`policy_loss` — the clipped surrogate with asymmetric clipping (``eps_low``,
  ``eps_high``: DAPO's clip-higher), token- or sequence-level importance ratios (GSPO), an
  optional k3 penalty to the reference, and the loss aggregations ``grpo`` (mean per sequence,
  then over sequences), ``bnpo`` (mean over this batch's tokens), ``dapo`` (token sum ÷ tokens
  in the whole step, so gradient accumulation does not change the weighting) and ``dr_grpo``
  (token sum ÷ (sequences × max completion length)).

Shapes: ``[B, T]`` for per-token tensors (``mask`` is 1 on the model's own sampled tokens, 0 on
prompt, tool output, user text and padding), ``[B]`` for advantages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # pragma: no cover
    import torch

Estimator = Literal["grpo", "dr_grpo", "batch", "rloo", "reinforce_pp"]
LossType = Literal["grpo", "bnpo", "dapo", "dr_grpo"]
Level = Literal["token", "sequence"]
ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "batch", "rloo", "reinforce_pp")
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dapo", "dr_grpo")


def _group_index(groups: Sequence[object] | torch.Tensor, n: int) -> torch.Tensor:
    import torch

    if isinstance(groups, torch.Tensor):
        keys = groups.tolist()
    else:
        keys = list(groups)
    if len(keys) != n:
        raise ValueError(f"group_advantages: {n} rewards but {len(keys)} group labels")
    ids: dict[object, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def _std(x: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected standard deviation; 0 for a single value."""
    return x.std(unbiased=True) if x.numel() > 1 else x.new_zeros(())


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    groups: Sequence[object] | torch.Tensor,
    estimator: Estimator = "grpo",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages ``[N]`` for rewards ``[N]`` whose group (task) labels are ``groups``.

    Returns ``(advantages, zero_std)`` where ``zero_std[i]`` says rollout ``i`` has no learning
    signal (DAPO's dynamic sampling drops those): its group's rewards are identical, or, for
    ``reinforce_pp``, whose baseline is the whole batch's, all rewards in the batch are.
    """
    import torch

    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    g = _group_index(groups, r.numel())
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    adv = torch.zeros_like(r)
    zero = torch.zeros(r.numel(), dtype=torch.bool)
    batch_std = _std(r)
    if estimator == "reinforce_pp":
        flat = bool(torch.isclose(batch_std, batch_std.new_zeros(()))) if r.numel() else True
        adv = (r - r.mean()) / (batch_std + eps) if r.numel() else adv
        return adv.float(), torch.full((r.numel(),), flat, dtype=torch.bool)
    for k in range(int(g.max()) + 1 if r.numel() else 0):
        idx = (g == k).nonzero().flatten()
        x = r[idx]
        mean, std = x.mean(), _std(x)
        zero[idx] = bool(torch.isclose(std, std.new_zeros(())))
        if estimator == "grpo":
            adv[idx] = (x - mean) / (std + eps)
        elif estimator == "dr_grpo":
            adv[idx] = x - mean
        elif estimator == "batch":
            adv[idx] = (x - mean) / (batch_std + eps)
        else:  # rloo: r_i - mean of the others = G/(G-1) * (r_i - mean)
            n = x.numel()
            adv[idx] = (x - mean) * (n / (n - 1)) if n > 1 else torch.zeros_like(x)
    return adv.float(), zero


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` at ``targets``: ``logits [B, T, V]``, ``targets [B, T]`` → ``[B, T]``.

    ``temperature`` 0 (greedy sampling) is treated as 1, as the sampler reports untempered
    log-probs for greedy draws. Computed in float32 (float64 kept).
    """
    import torch

    t = float(temperature) if temperature and temperature > 0 else 1.0
    x = logits if logits.dtype == torch.float64 else logits.float()
    lp = (x / t).log_softmax(-1)
    return lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) from samples of π: ``exp(ref - logp) - (ref - logp) - 1``."""
    import torch

    d = ref_logp - logp
    return torch.exp(d) - d - 1


@dataclass(frozen=True)
class LossConfig:
    """Hyper-parameters of :func:`policy_loss` (defaults: DAPO's clip-higher, no KL, token sum ÷ tokens)."""

    loss_type: LossType = "dapo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    beta: float = 0.0
    level: Level = "token"
    max_completion_length: int | None = None  # dr_grpo's constant; default: the longest in the step

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; choose one of {', '.join(LOSS_TYPES)}")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"unknown importance level {self.level!r}; choose 'token' or 'sequence'")
        if self.eps_low < 0 or self.eps_high < 0 or self.beta < 0:
            raise ValueError("eps_low, eps_high and beta must be >= 0")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig = LossConfig(),
    *,
    ref_logp: torch.Tensor | None = None,
    num_seqs: int | None = None,
    num_tokens: float | None = None,
    seq_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate loss of one (micro-)batch and its statistics.

    ``num_seqs``/``num_tokens`` are the sequence and masked-token counts of the whole optimiser
    step when it is split into micro-batches (defaults: this batch), so summing the micro-batch
    losses gives the loss of the step: ``grpo`` divides each sequence's token mean by
    ``num_seqs``; ``dapo`` divides the token sum by ``num_tokens``; ``dr_grpo`` by
    ``num_seqs * max_completion_length``; ``bnpo`` is this batch's token mean (as in TRL).
    ``seq_weights`` ``[B]`` replaces ``grpo``'s per-sequence ``1 / tokens``: a multi-turn
    trajectory packed into several sequences is weighted ``1 / (its trained tokens)`` in all of
    them, so it counts as one sample (``num_seqs`` then counts trajectories).
    """
    import torch

    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).reshape(-1, 1)
    log_ratio = logp - old_logp
    if cfg.level == "sequence":  # GSPO: one ratio per sequence, the geometric mean of the token ratios
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_w = log_ratio
    ratio = torch.exp(log_w)
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if cfg.beta != 0.0:
        if ref_logp is None:
            raise ValueError("policy_loss: beta > 0 needs ref_logp")
        kl = k3(logp, ref_logp)
        per_token = per_token + cfg.beta * kl
    per_token = per_token * mask
    n_seqs = int(num_seqs) if num_seqs is not None else logp.shape[0]
    if cfg.loss_type == "grpo":
        w = seq_weights.to(logp.dtype) if seq_weights is not None else 1.0 / mask.sum(-1).clamp(min=1.0)
        loss = (per_token.sum(-1) * w).sum() / max(n_seqs, 1)
    elif cfg.loss_type == "bnpo":
        loss = per_token.sum() / mask.sum().clamp(min=1.0)
    elif cfg.loss_type == "dapo":
        n_tok = float(num_tokens) if num_tokens is not None else float(mask.sum())
        loss = per_token.sum() / max(n_tok, 1.0)
    else:  # dr_grpo
        L = cfg.max_completion_length or logp.shape[1]
        loss = per_token.sum() / (max(n_seqs, 1) * L)
    with torch.no_grad():
        m = mask.bool()
        a = adv.expand_as(logp)
        r = ratio.expand_as(logp)
        low = (r < 1 - cfg.eps_low) & (a < 0) & m
        high = (r > 1 + cfg.eps_high) & (a > 0) & m
        n = max(int(m.sum()), 1)
        stats = {
            "clip_low": float(low.sum()) / n,
            "clip_high": float(high.sum()) / n,
            "ratio_mean": float(r[m].mean()) if m.any() else 1.0,
            "kl": float(kl[m].mean()) if kl is not None and m.any() else 0.0,
        }
    return loss, stats


__all__ = ["ESTIMATORS", "LOSS_TYPES", "LossConfig", "group_advantages", "k3", "policy_loss", "token_logprobs"]
