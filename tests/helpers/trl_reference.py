"""Record TRL's GRPO loss and gradients on fixed tensors, for tests/policy/test_rl.py to compare against.

TRL is not a dependency of evolvekit (with its datasets/pyarrow/accelerate stack it is larger
than everything the tests need), so its answers are recorded once here and checked in as
``tests/data/trl_grpo_reference.json``; the test also recomputes them live when TRL is
installed. Each case calls TRL's own ``GRPOTrainer._compute_loss`` (the unbound method, with the
attributes it reads set on a stand-in ``self`` and the model's per-token log-probs given
directly), so this is TRL's code on identical tensors, not a re-implementation.

    .venv/bin/pip install trl==1.16.0
    .venv/bin/python tests/helpers/trl_reference.py          # rewrites tests/data/trl_grpo_reference.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

OUT = Path(__file__).resolve().parents[1] / "data" / "trl_grpo_reference.json"

CASES = [
    {"loss_type": lt, "level": lv, "beta": beta, "off_policy": off}
    for lt in ("grpo", "bnpo", "dapo", "dr_grpo")
    for lv in ("token", "sequence")
    for beta in (0.0, 0.04)
    for off in (False, True)
]
EPS_LOW, EPS_HIGH, MAX_COMPLETION = 0.2, 0.28, 7


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Four sequences of 7 completion positions with ragged masks (a hole where a tool result sat)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 7
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.8  # ratios well past the clip range
    ref = logp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.6
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1]],
        dtype=torch.float64,
    )
    adv = torch.tensor([1.2, -0.7, 0.4, -0.9], dtype=torch.float64)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv}


def trl_loss(case: dict, t: dict[str, torch.Tensor]) -> tuple[float, list]:
    """TRL's loss for ``case`` on tensors ``t`` and its gradient with respect to the per-token log-probs."""
    from trl import GRPOTrainer

    logp = t["logp"].clone().requires_grad_(True)
    old = logp.detach() if not case["off_policy"] else t["old"]
    acc = SimpleNamespace(
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        num_processes=1,
        sync_gradients=True,
    )
    me = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        aux_loss_enabled=False,
        importance_sampling_level=case["level"],
        beta=case["beta"],
        loss_type=case["loss_type"],
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
        use_vllm=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION,
        accelerator=acc,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )
    B, T = logp.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": t["mask"].long(),
        "advantages": t["adv"],
        "num_items_in_batch": t["mask"].sum(),
    }
    if case["off_policy"]:
        inputs["old_per_token_logps"] = old
    if case["beta"]:
        inputs["ref_per_token_logps"] = t["ref"]
    loss = GRPOTrainer._compute_loss(me, None, inputs)
    loss.backward()
    return float(loss.detach()), logp.grad.tolist()


def main() -> None:
    import trl

    t = tensors()
    rows = []
    for case in CASES:
        loss, grad = trl_loss(case, t)
        rows.append({**case, "loss": loss, "grad": grad})
    data = {
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "eps_low": EPS_LOW,
        "eps_high": EPS_HIGH,
        "max_completion_length": MAX_COMPLETION,
        "tensors": {k: v.tolist() for k, v in t.items()},
        "cases": rows,
    }
    OUT.write_text(json.dumps(data, indent=1))
    print(f"wrote {len(rows)} cases from TRL {trl.__version__} to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
