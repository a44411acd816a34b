"""How far one GRPO optimiser step moves the policy: k3 KL to the reference before each step.

Replays the first recorded GRPO batch of a finished run (its trajectories are in the archive) through
a fresh :class:`~evolve.policy.grpo_train.Learner` on the run's SFT base, split into optimiser steps
(one pass, on-policy per step, no PPO-ptx), and prints the mean per-token KL to the base before each
step for each learning rate and warmup. It needs no rollouts, so it isolates the optimiser.

    .venv/bin/python bench/training/grpo_kl_probe.py --run RUN_DIR --base SFT_BASE.safetensors \\
        [--settings 3e-3:0,3e-3:8,1e-3:0] [--steps 8] [--reward-weight executes=0.25]

RUN_DIR is an ``evolve run`` directory of examples/sql_agent/grpo.yaml; SFT_BASE is the cold-start
weights its log names ("reusing cached SFT weights ...").
"""

from __future__ import annotations

import argparse
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--settings", default="3e-3:0,3e-3:8,1e-3:0", help="lr:warmup pairs")
    ap.add_argument("--steps", type=int, default=8, help="optimiser steps the batch is split into")
    ap.add_argument("--batch", type=int, default=2048, help="trajectories of the first GRPO batch")
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--reward-weight", action="append", default=[], help="component=weight (grpo reward_weights)")
    a = ap.parse_args()

    import torch

    from evolve.archive.store import Archive
    from evolve.policy.grpo import GRPO
    from evolve.policy.grpo_train import Learner
    from evolve.policy.rl import LossConfig
    from evolve.policy.weights import load_base

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    trajs = [r.trajectory for r in Archive(a.run, create=False).trajectory_rows(phase="grpo", limit=a.batch)]
    weights = {k: float(v) for k, v in (w.split("=", 1) for w in a.reward_weight)}
    op = GRPO(reward_weights=weights)
    print(f"{len(trajs)} trajectories from {a.run}; reward_weights {weights or 'none'}; beta {a.beta}")
    for setting in a.settings.split(","):
        lr, warmup = float(setting.split(":")[0]), int(setting.split(":")[1])
        model, tok, _ = load_base(a.base)
        learner = Learner(
            model, cfg=LossConfig(loss_type="grpo", beta=a.beta), lr=lr, warmup=warmup, pad_id=tok.pad_id, seed=1
        )
        seqs, _ = op._batch(trajs, learner.max_len)
        samples: dict[int, list] = {}
        for s in seqs:
            samples.setdefault(s.traj, []).append(s)
        groups = list(samples.values())
        random.Random(0).shuffle(groups)
        chunks = [[s for g in groups[i :: a.steps] for s in g] for i in range(a.steps)]
        kls = [learner.update(c).kl for c in chunks + chunks[:1]]  # the last update only measures
        print(
            f"lr {lr:g}, warmup {warmup}: KL before step 1..{a.steps + 1}: " + " ".join(f"{k:.4g}" for k in kls),
            flush=True,
        )


if __name__ == "__main__":
    main()
