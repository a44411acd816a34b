"""Memory and time of one LoRA SFT step with a 151,936-token vocabulary (Qwen2's): the LM head on
every position (what evolve.policy.train did until 2026-12-01) against the head on target
positions alone (``train.target_logits``, what SFT, STaR, PPO-ptx and validation loss do now),
and the same with gradient checkpointing (``params.gradient_checkpointing: true``).

    python bench/training/sft_vocab.py [--batch 8] [--prompt 400] [--completion 40] [--threads 2] [--layers 4]
                              [--modes full,targets,checkpointed]

A random Qwen2-shaped model (hidden 256, 4 layers unless told, tied embeddings, LoRA r=16 on the attention
and MLP projections) on the CPU; the batch looks like the SQL world's: long prompts (schema, tool
output) and short completions. Each mode runs in its own process, so its peak resident memory is
its own; the figure printed is the peak minus the resident memory before the first step."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODES = {
    "full": "LM head on every position",
    "targets": "LM head on targets only",
    "checkpointed": "targets only + gradient checkpointing",
}


def step_cost(mode: str, batch: int, prompt: int, completion: int, threads: int, layers: int) -> dict:
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from evolve.policy.train import lora_targets, target_logits
    from evolve.policy.weights import checkpoint_activations

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    base = Qwen2ForCausalLM(cfg)
    if mode == "checkpointed":
        checkpoint_activations(base)
    model = get_peft_model(base, LoraConfig(r=16, target_modules=lora_targets(base)))
    model.train()
    L = prompt + completion
    x = torch.randint(0, cfg.vocab_size, (batch, L))
    y = torch.full_like(x, -100)
    y[:, prompt - 1 : L - 1] = x[:, prompt:]
    params = [p for p in model.parameters() if p.requires_grad]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(3):
        t = time.perf_counter()
        if mode == "full":
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=-100)
        else:
            logits, targets = target_logits(model, x, y)
            loss = F.cross_entropy(logits.float(), targets)
        grads = torch.autograd.grad(loss, params)
        times.append(time.perf_counter() - t)
        del logits, loss, grads
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "step_s": sorted(times)[1], "peak_mb": (peak - before) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=400)
    ap.add_argument("--completion", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES), help="a comma-separated subset of " + ", ".join(MODES))
    ap.add_argument("--mode", choices=list(MODES), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mode:
        print(json.dumps(step_cost(a.mode, a.batch, a.prompt, a.completion, a.threads, a.layers)))
        return
    for mode in a.modes.split(","):
        label = MODES[mode]
        run = subprocess.run([sys.executable, __file__, "--mode", mode] + sys.argv[1:], capture_output=True, text=True)
        if run.returncode:
            print(f"{label}: the process died (exit {run.returncode}; -9 is the kernel's out-of-memory kill)")
            continue
        r = json.loads(run.stdout.strip().splitlines()[-1])
        print(
            f"{label:42s} "
            f"step {r['step_s']:.2f} s, peak memory +{r['peak_mb']:,.0f} MB "
            f"(batch {a.batch} x {a.prompt}+{a.completion} tokens, {a.layers} layers, V=151,936, {a.threads} threads)"
        )


if __name__ == "__main__":
    main()
