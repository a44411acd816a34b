"""Sampling cost with a 151,936-token vocabulary (Qwen2's): inverse-CDF draws (one uniform per row
and step, what evolve.policy.sampling does above INVERSE_CDF_VOCAB) against per-row Gumbel noise
(V uniforms per row and step, what it does for the tiny vocabularies).

    python bench/sampling/sample_vocab.py [--batch 32] [--tokens 32] [--threads 2]

A random Qwen2-shaped model (hidden 256, 4 layers) on the CPU; prints decode tokens/s for each,
and the CPU time per decode step spent drawing the random numbers, which on a GPU is not hidden
behind the model (the generators are CPU ones, so a seed gives the same sample on any device)."""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from evolve.policy import sampling


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    prompts = [[(7 * i + j) % 5000 + 10 for j in range(64)] for i in range(a.batch)]
    kw = dict(eos_id=-1, temperatures=1.0, max_tokens=a.tokens, seeds=list(range(a.batch)))
    for name, vocab_limit, at_once in (("inverse CDF", 4096, 1 << 24), ("Gumbel, a step at a time", 1 << 30, 0)):
        sampling.INVERSE_CDF_VOCAB, sampling.NOISE_AT_ONCE = vocab_limit, at_once
        sampling.sample(model, prompts[:2], **{**kw, "seeds": [0, 1], "max_tokens": 2})  # warm up
        t = time.perf_counter()
        out = sampling.sample(model, prompts, **kw)
        s = time.perf_counter() - t
        n = sum(len(o.token_ids) for o in out)
        print(f"{name:26s} {n} tokens in {s:.2f} s: {n / s:,.0f} tokens/s (batch {a.batch}, {a.threads} threads)")
    # the part that stays on the CPU whatever the model's device: each step's random numbers
    gens = [torch.Generator().manual_seed(i) for i in range(a.batch)]
    alive, rows = [True] * a.batch, list(range(a.batch))
    t = time.perf_counter()
    for _ in range(a.tokens):
        sampling._step_gumbel(gens, rows, alive, cfg.vocab_size)
    g = (time.perf_counter() - t) / a.tokens
    t = time.perf_counter()
    for _ in range(a.tokens):
        torch.tensor([float(torch.rand((), generator=gens[o], dtype=torch.float64)) for o in rows])
    u = (time.perf_counter() - t) / a.tokens
    print(
        f"CPU-side randomness per decode step, batch {a.batch}: Gumbel {1000 * g:.1f} ms, inverse CDF {1000 * u:.2f} ms"
    )


if __name__ == "__main__":
    main()
