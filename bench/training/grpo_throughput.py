"""GRPO training throughput: evolvekit's Learner against TRL's GRPOTrainer step, same model and batch.

Both sides train the same LoRA adapter (r=16 on every attention and MLP projection) of the same
random-init tiny Llama on the same batch of prompt + completion ids with the same advantages,
AdamW, one optimiser step per generation batch (on-policy), ``loss_type="dapo"``, no KL. The TRL
side runs TRL's own code for what a training step computes — ``_get_per_token_logps_and_entropies``
(its chunked forward through the fused, tiled LM head that ``GRPOTrainer.__init__`` installs,
with temperature, entropies on, as in training)
and ``_compute_loss`` — bound to a stand-in for the trainer object, so generation, reward calls,
dataloaders and accelerate are out of both measurements. Each side runs in its own process (peak
RSS is per process). Figures: trained (completion) tokens/s, all tokens/s, optimiser steps/s.

    .venv/bin/pip install trl==1.16.0      # the bench needs TRL; evolvekit does not
    .venv/bin/python bench/training/grpo_throughput.py [--d-model 128 --layers 2 --batch 256 --prompt 160 --completion 64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from types import SimpleNamespace


def make(args: argparse.Namespace):
    import torch

    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model

    tok = CharTokenizer()
    cfg = TinyConfig(
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=4,
        d_ff=args.d_model * 2,
        max_len=args.prompt + args.completion + 8,
    )
    model = build_model(cfg, seed=0, tokenizer=tok)
    g = torch.Generator().manual_seed(0)
    B, P, C = args.batch, args.prompt, args.completion
    prompts = torch.randint(4, tok.vocab_size, (B, P), generator=g)
    comps = torch.randint(4, tok.vocab_size, (B, C), generator=g)
    lengths = torch.randint(C // 4, C + 1, (B,), generator=g)  # ragged completions
    cmask = (torch.arange(C)[None, :] < lengths[:, None]).long()
    adv = torch.randn(B, generator=g)
    return torch, model, prompts, comps, cmask, adv


# TRL's fused LM head reads ``lm_head.weight`` directly, so a LoRA on lm_head would be ignored on its
# side (no gradient, no cost); both sides therefore adapt the projections only, for equal work.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))


def run_ours(args: argparse.Namespace) -> dict:
    import math as _m

    from evolve.policy.grpo_train import Learner, Packed
    from evolve.policy.rl import LossConfig

    torch, model, prompts, comps, cmask, adv = make(args)
    learner = Learner(
        model, cfg=LossConfig(loss_type="dapo"), lr=1e-4, micro_batch=args.micro_batch, target_modules=TARGETS
    )
    seqs = []
    for i in range(prompts.shape[0]):
        n = int(cmask[i].sum())
        ids = prompts[i].tolist() + comps[i, :n].tolist()
        seqs.append(
            Packed(
                ids=ids,
                mask=[0] * prompts.shape[1] + [1] * n,
                sampler_logp=[_m.nan] * len(ids),
                temperature=args.temperature,
                advantage=float(adv[i]),
            )
        )
    learner.update(seqs)  # warm-up
    t0 = time.perf_counter()
    tokens = trained = 0
    for _ in range(args.steps):
        st = learner.update(seqs)
        tokens += st.tokens
        trained += st.trained_tokens
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "trained": trained}


def run_trl(args: argparse.Namespace) -> dict:
    import contextlib

    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    torch, model, prompts, comps, cmask, adv = make(args)
    model = lora(model)
    # what GRPOTrainer.__init__ does: per-token log-probs from a tiled, fused LM head
    add_fused_lm_head(model.get_base_model(), temperature=args.temperature, outputs=("log_probs", "entropy"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    B, C = comps.shape
    acc = SimpleNamespace(
        gather=lambda x: x,
        gather_for_metrics=lambda x: x,
        reduce=lambda x, reduction="sum": x,
        num_processes=1,
        sync_gradients=True,
        is_main_process=True,
        autocast=contextlib.nullcontext,
    )
    me = SimpleNamespace(
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        aux_loss_enabled=False,
        importance_sampling_level="token",
        beta=0.0,
        loss_type="dapo",
        epsilon_low=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        model=model,
        current_gradient_accumulation_steps=1,
        max_completion_length=C,
        accelerator=acc,
        _entropy_bonus_enabled=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        temperature=args.temperature,
        model_kwarg_keys=set(),
        use_liger_kernel=False,
    )
    me._get_per_token_logps_and_entropies = lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(me, *a, **k)
    mb = args.micro_batch

    def step() -> int:
        opt.zero_grad(set_to_none=True)
        n_items = cmask.sum()
        for s in range(0, B, mb):
            inputs = {
                "prompt_ids": prompts[s : s + mb],
                "prompt_mask": torch.ones_like(prompts[s : s + mb]),
                "completion_ids": comps[s : s + mb],
                "completion_mask": cmask[s : s + mb],
                "advantages": adv[s : s + mb],
                "num_items_in_batch": n_items,
            }
            loss = GRPOTrainer._compute_loss(me, model, inputs)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return int(n_items)

    step()  # warm-up
    t0 = time.perf_counter()
    trained = sum(step() for _ in range(args.steps))
    tokens = args.steps * (B * prompts.shape[1] + int(cmask.sum()))  # real tokens, padding not counted
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "trained": trained}


def child(side: str, args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    out = (run_ours if side == "evolvekit" else run_trl)(args)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256, help="sequences per generation batch (tasks x G)")
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=160)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--side", choices=["evolvekit", "trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        return child(args.side, args)
    rows = {}
    for side in ("evolvekit", "trl"):
        cmd = [sys.executable, __file__, "--side", side] + sys.argv[1:]
        res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if res.returncode:
            sys.exit(f"{side} failed:\n{res.stderr[-3000:]}")
        rows[side] = json.loads(res.stdout.strip().splitlines()[-1])
    print(
        f"tiny Llama d={args.d_model} L={args.layers}, LoRA r=16 (projections); batch {args.batch} x (prompt {args.prompt} + "
        f"completion <= {args.completion}), micro-batch {args.micro_batch}, {args.steps} optimiser steps, "
        f"{args.threads} threads"
    )
    print(f"{'':10} {'trained tok/s':>14} {'all tok/s':>10} {'steps/s':>8} {'peak RSS MB':>12}")
    for side, r in rows.items():
        s = r["seconds"]
        print(
            f"{side:10} {r['trained'] / s:14,.0f} {r['tokens'] / s:10,.0f} {args.steps / s:8.3f} {r['peak_rss_mb']:12,.0f}"
        )
    ratio = (rows["evolvekit"]["trained"] / rows["evolvekit"]["seconds"]) / (
        rows["trl"]["trained"] / rows["trl"]["seconds"]
    )
    print(f"evolvekit / TRL trained-token throughput: {ratio:.2f}x")


if __name__ == "__main__":
    main()
