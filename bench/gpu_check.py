"""GPU checks of the weights layer: the GRPO loss on CUDA equals CPU's, and training throughput at ~0.5B.

One prepared script for a session that is lent a GPU (the device tool gives minutes, not hours):

0. **CTranslate2 on CUDA** (``--ct2 SHAPE_DIR``, run first; issue 51 item 4): ``bench/sampling/ct2_speed.py`` on
   this device, tokens/s at batch 1, 8 and 64 for our sampler, transformers' ``generate`` and
   CTranslate2 in int8_float16, float16 and float32, and what a new system costs; then batch 8 at
   T 0.7 with and without log-probs (the sampling call's logits, read off the device)
   (:func:`ctranslate2_bench`). ``bash bench/gpu/gpu_ct2.sh`` prepares and runs it with the rest.
1. **CUDA = CPU.** The same random-init tiny Llama with the same fresh LoRA adapter on both devices,
   the same packed sequences (masked prompts, ragged completions), old and reference log-probs
   perturbed so that ratios leave the clip range and the KL term is not zero. For every loss type
   (grpo, bnpo, dapo, dr_grpo), both importance levels (token, sequence), with and without the k3 KL
   term: the loss and every LoRA gradient (lora_B perturbed, so lora_A's are not all zero), CPU vs
   CUDA, float32 with TF32 off. Then one full ``Learner.update`` (2 iterations x 2 minibatches, with
   PPO-ptx) per device and what it changed in the adapter; and the sampler on CUDA: its log-probs against the trainer's on the same ids (the
   ``mismatch`` a GRPO step reports), and its tokens against the CPU sampler's for the same seeds.
2. **Throughput at ~0.5B parameters** (random init, ``--big``): ``Learner.update`` tokens/s and
   optimiser steps/s, the sampler's generated tokens/s, and peak GPU memory.
3. **A pretrained-format checkpoint** (``evolve.policy.hf``): a random model in Qwen2.5-0.5B's
   shape (``--big``; a small one otherwise) written with ``save_pretrained`` beside a BPE tokenizer
   with a chat template, loaded by ``load_pretrained`` with ``device``/``dtype`` ``auto`` (bfloat16
   on the GPU), sampled through the inverse-CDF path (151,936-token vocabulary), then one GRPO
   update: sampler tokens/s, trainer tokens/s, the sampler-vs-trainer log-prob gap in bfloat16,
   peak memory.

    bash bench/gpu/gpu_wheels.sh     # here, once: pydantic & co. as Python 3.12 wheels in .whl (the GPU image lacks them)
    # on the GPU machine (device tool, carry [".whl"]), torch/transformers/peft from its image:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu_check.json
    .venv/bin/python bench/gpu_check.py --device cpu --no-big      # a smoke run of the same code here
    .venv/bin/python bench/gpu_check.py --device cpu --no-big --ct2 .gpuct2/shape --ct2-batches 1 --ct2-timeout 900

``bench/gpu/gpu_smollm.sh`` runs this script, then ``examples/sql_agent/task_smollm.yaml`` with SmolLM2 on the
GPU (its GGUF travels in two parts: two calls to one warm machine).

Writes one JSON document (after each part, so a call cut short keeps what ran; printed at the end).
Exit status 1 when a CUDA-vs-CPU comparison is off by more than ``--tol`` (relative to the largest CPU
value).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_paths import map_policy_package  # noqa: E402

map_policy_package()
from evolve.policy.grpo_train import Learner, Packed, collate, sequence_logprobs  # noqa: E402
from evolve.policy.rl import LOSS_TYPES, LossConfig, policy_loss  # noqa: E402
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model, count_params, sample  # noqa: E402

TOK = CharTokenizer()
SMALL = TinyConfig(d_model=128, n_layers=2, n_heads=4, d_ff=256, max_len=256)
# ~0.49B parameters (486,818,816 by count_params): width 1024, 32 layers, grouped-query attention, our small vocabulary
BIG = TinyConfig(d_model=1024, n_layers=32, n_heads=16, n_kv_heads=4, d_ff=4096, max_len=1024)


def batch_of(n: int, prompt: int, completion: int, seed: int) -> list[Packed]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(prompt // 2, prompt + 1, (1,), generator=g))
        c = int(torch.randint(completion // 4, completion + 1, (1,), generator=g))
        ids = torch.randint(4, TOK.vocab_size, (p + c,), generator=g).tolist()
        out.append(
            Packed(
                ids=ids,
                mask=[0] * p + [1] * c,
                sampler_logp=[math.nan] * (p + c),
                temperature=0.8,
                advantage=float(torch.randn(1, generator=g)),
                traj=i,
            )
        )
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double().cpu()).abs().max() / a.double().abs().max().clamp(min=1e-12))


def loss_and_grads(device: str, seqs: list[Packed], cfg: LossConfig, seed: int = 0) -> tuple[float, dict]:
    learner = Learner(build_model(SMALL, seed=seed).to(device), cfg=cfg, r=8, alpha=16, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # a fresh adapter has lora_B = 0, which zeroes every lora_A gradient: perturb B
        for name, p in sorted(learner.model.named_parameters()):
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    b = {k: v.to(device) for k, v in collate(seqs, TOK.pad_id).items()}
    shape = b["input_ids"].shape
    with torch.no_grad():
        base = sequence_logprobs(learner.model, b)
    old = base + (0.3 * torch.randn(shape, generator=g)).to(device)  # ratios well outside [1-eps, 1+eps]
    ref = base + (0.2 * torch.randn(shape, generator=g)).to(device)
    lp = sequence_logprobs(learner.model, b)
    loss, _ = policy_loss(
        lp,
        old,
        b["advantages"],
        b["mask"],
        cfg,
        ref_logp=ref if cfg.beta else None,
        num_seqs=len(seqs),
        num_tokens=float(b["mask"].sum()),
        seq_weights=b["seq_weights"],
    )
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in learner.model.named_parameters() if p.grad is not None}
    assert all(float(v.abs().max()) > 0 for v in grads.values()), "a LoRA gradient is all zeros: nothing compared"
    return float(loss.detach()), grads


def check_equal(device: str, tol: float) -> dict:
    seqs = batch_of(24, 48, 32, seed=0)
    rows, worst = [], 0.0
    for loss_type in LOSS_TYPES:
        for level in ("token", "sequence"):
            for beta in (0.0, 0.04):
                cfg = LossConfig(loss_type=loss_type, level=level, beta=beta, max_completion_length=32)
                l_cpu, g_cpu = loss_and_grads("cpu", seqs, cfg)
                l_dev, g_dev = loss_and_grads(device, seqs, cfg)
                g_err = max(rel(g_cpu[n], g_dev[n]) for n in g_cpu)
                l_err = abs(l_cpu - l_dev) / max(abs(l_cpu), 1e-12)
                worst = max(worst, g_err, l_err)
                rows.append(
                    {
                        "loss_type": loss_type,
                        "level": level,
                        "beta": beta,
                        "loss_cpu": l_cpu,
                        "loss_dev": l_dev,
                        "loss_rel_err": l_err,
                        "grad_max_rel_err": g_err,
                        "lora_tensors": len(g_cpu),
                    }
                )
    # a full update: 2 iterations x 2 minibatches, PPO-ptx on demo pairs, on each device
    demos = [(s.ids[: s.mask.index(1)], s.ids[s.mask.index(1) :]) for s in batch_of(16, 48, 32, seed=7)]
    deltas, losses = {}, {}
    for dev in ("cpu", device):
        learner = Learner(
            build_model(SMALL, seed=3).to(dev),
            cfg=LossConfig(beta=0.04),
            r=8,
            alpha=16,
            lr=1e-3,
            seed=3,
            num_iterations=2,
            minibatches=2,
            ptx=demos,
            ptx_coef=0.5,
            ptx_batch=8,
        )
        before = learner.adapter().weights
        losses[dev] = learner.update(seqs).loss
        deltas[dev] = {k: v - before[k] for k, v in learner.adapter().weights.items()}
    # what the 4 AdamW steps changed (not the weights, which the shared init dominates). Reported, not
    # gated: Adam's first steps are ~lr*sign(g), so a near-zero gradient whose rounding differs between
    # devices moves one entry by a whole step, a device difference that is not a bug
    upd = max(rel(deltas["cpu"][k], deltas[device][k]) for k in deltas["cpu"])
    return {
        "cases": rows,
        "update_delta_max_rel_err": upd,
        "update_loss": losses,
        "worst_rel_err": worst,
        "tol": tol,
        "ok": worst <= tol,
    }


def check_sampler(device: str) -> dict:
    """The sampler's log-probs on ``device`` against the trainer's, and its ids against CPU's (same seeds)."""
    model = build_model(SMALL, seed=5)
    prompts = [s.ids[: s.mask.index(1)] for s in batch_of(32, 48, 8, seed=9)]
    seeds = list(range(len(prompts)))
    kw = dict(eos_id=TOK.eos_id, pad_id=TOK.pad_id, temperatures=0.8, max_tokens=32, seeds=seeds)
    on_cpu = sample(model, prompts, **kw)
    on_dev = sample(model.to(device), prompts, **kw)
    same = sum(a.token_ids == b.token_ids for a, b in zip(on_cpu, on_dev))
    seqs = [
        Packed(
            ids=list(p) + s.token_ids,
            mask=[0] * len(p) + [1] * len(s.token_ids),
            sampler_logp=[math.nan] * len(p) + s.logprobs,
            temperature=0.8,
            advantage=1.0,
            traj=i,
        )
        for i, (p, s) in enumerate(zip(prompts, on_dev))
    ]
    learner = Learner(model, r=8, alpha=16, seed=0)  # a fresh adapter: the same function as the sampler's model
    st = learner.update(seqs)
    return {"same_ids_as_cpu": f"{same}/{len(prompts)}", "trainer_vs_sampler_logp_mean_abs": st.mismatch}


def throughput(device: str, cfg: TinyConfig, n: int, prompt: int, completion: int, micro: int) -> dict:
    model = build_model(cfg, seed=0).to(device)
    params = count_params(model)
    learner = Learner(model, r=16, alpha=32, seed=0, micro_batch=micro, micro_batch_tokens=0, lr=1e-4)
    seqs = batch_of(n, prompt, completion, seed=1)
    cuda = device.startswith("cuda")
    learner.update(seqs)  # warm-up (kernels, allocator)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    stats = []
    for _ in range(3):
        stats.append(learner.update(seqs))
        if cuda:
            torch.cuda.synchronize()
    secs = sum(s.seconds for s in stats)
    out = {
        "params": params,
        "config": cfg.model_dump(),
        "sequences": n,
        "prompt_max": prompt,
        "completion_max": completion,
        "micro_batch": micro,
        "tokens_per_s": round(sum(s.tokens for s in stats) / secs),
        "trained_tokens_per_s": round(sum(s.trained_tokens for s in stats) / secs),
        "optimizer_steps_per_s": round(sum(s.optimizer_steps for s in stats) / secs, 3),
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    prompts = [s.ids[: s.mask.index(1)] for s in seqs]
    learner.model.eval()
    t0 = time.perf_counter()
    gen = sample(
        learner.model,
        prompts,
        eos_id=-1,
        pad_id=TOK.pad_id,
        temperatures=1.0,
        max_tokens=completion,
        seeds=list(range(len(prompts))),
    )  # eos_id -1: every row runs to max_tokens
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out["sampler_tokens_per_s"] = round(sum(len(g.token_ids) for g in gen) / dt)
    out["sampler_batch"] = len(prompts)
    return out


def pretrained(device: str, big: bool) -> dict:
    import tempfile

    from evolve.policy.hf import load_pretrained
    from evolve.types import Message
    from tests.helpers.hf_checkpoint import make_checkpoint  # ROOT is on sys.path

    shape = (
        dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936)
        if big
        else dict(hidden=64, layers=2, heads=4, kv_heads=2, vocab=151936)
    )
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp) / "ck", **shape)
        model, tok = load_pretrained(Path(tmp) / "ck", device=device, dtype="auto")
    chats = [
        [
            Message(role="system", content="answer with one SQL query"),
            Message(role="user", content=f"select name from users where age > {i} " * (1 + i % 4)),
        ]
        for i in range(64)
    ]
    prompts = [tok.render_chat(c) for c in chats]
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    gen = sample(
        model, prompts, eos_id=-1, pad_id=tok.pad_id, temperatures=1.0, max_tokens=128, seeds=list(range(len(prompts)))
    )
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    seqs = [
        Packed(
            ids=list(p) + g.token_ids,
            mask=[0] * len(p) + [1] * len(g.token_ids),
            sampler_logp=[math.nan] * len(p) + g.logprobs,
            temperature=1.0,
            advantage=(-1.0) ** i,
            traj=i,
        )
        for i, (p, g) in enumerate(zip(prompts, gen))
    ]
    learner = Learner(model, r=16, alpha=32, seed=0, micro_batch=16, lr=1e-5)
    st = learner.update(seqs)
    if cuda:
        torch.cuda.synchronize()
    return {
        "params": count_params(model),
        "dtype": str(next(model.parameters()).dtype),
        "vocab": model.config.vocab_size,
        "sampler_tokens_per_s": round(sum(len(g.token_ids) for g in gen) / dt),
        "sampler_batch": len(prompts),
        "trainer_tokens_per_s": round(st.tokens / st.seconds) if st.seconds else None,
        "trainer_vs_sampler_logp_mean_abs": st.mismatch,
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }


def ctranslate2_bench(device: str, shape: str, batches: str, timeout: float) -> dict:
    """Issue 51, item 4: ``bench/sampling/ct2_speed.py`` on this device (tokens/s at each batch for our sampler,
    transformers' ``generate`` and CTranslate2's compute types; what a new system costs), SmolLM2 as
    random weights in its shape (the folder ``shape``, made by ``bench/gpu/gpu_ct2.sh prepare``) and the
    tiny model, greedy; then SmolLM2 at batch 8 and T 0.7 in int8_float16 and float16, with and
    without log-probs (the sampling call's own logits, read off the device in float16).
    Each in a child process, so that a CUDA library CTranslate2's build cannot load ends that part
    alone; what it printed before is kept."""
    import subprocess
    import tempfile

    common = [
        sys.executable,
        str(ROOT / "bench" / "sampling" / "ct2_speed.py"),
        "--device",
        "cuda" if device.startswith("cuda") else "cpu",
        "--smollm2-shape",
        shape,
        "--max-new",
        "64",
        "--threads",
        str(min(8, os.cpu_count() or 1)),
    ]
    tempered = ["--models", "smollm2", "--batches", "8", "--repeats", "1", "--temperature", "0.7"]
    if device.startswith("cuda"):
        tempered += ["--compute-types", "int8_float16,float16"]
    runs = {
        "greedy": (["--batches", batches, "--repeats", "3"], timeout),
        "T 0.7, batch 8": (tempered, max(60.0, timeout / 5)),
    }
    res: dict = {}
    for name, (extra, limit) in runs.items():
        out = Path(tempfile.mkdtemp(prefix="gpu-ct2-")) / "ct2_speed.json"
        t0 = time.perf_counter()
        try:
            p = subprocess.run([*common, *extra, "--out", str(out)], capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as e:
            text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            res[name] = {"error": f"over {limit:g} s", "printed": text.splitlines()[-20:]}
            continue
        if p.returncode == 0 and out.exists():
            res[name] = {**json.loads(out.read_text()), "seconds": round(time.perf_counter() - t0, 1)}
        else:
            res[name] = {
                "error": f"exit {p.returncode}",
                "printed": p.stdout.splitlines()[-20:],
                "stderr": p.stderr[-3000:],
            }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--big", action=argparse.BooleanOptionalAction, default=True, help="the ~0.5B throughput figure")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--ct2",
        default=None,
        metavar="SHAPE_DIR",
        help="first, bench/sampling/ct2_speed.py on this device "
        "(issue 51 item 4), SmolLM2 as random weights in the shape of SHAPE_DIR (bash bench/gpu/gpu_ct2.sh prepare)",
    )
    ap.add_argument("--ct2-batches", default="1,8,64")
    ap.add_argument("--ct2-timeout", type=float, default=300)
    a = ap.parse_args()
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; run with --device cpu for a smoke run", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # the equality check runs in true float32
        torch.backends.cudnn.allow_tf32 = False
    import peft
    import transformers

    res: dict = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": platform.python_version(),
        "device": a.device,
        "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None,
    }

    def keep(part: str, value: dict) -> None:  # written after each part: a call cut short keeps what ran
        res[part] = value
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(res, indent=1))

    if a.ct2:
        keep("ctranslate2", ctranslate2_bench(a.device, a.ct2, a.ct2_batches, a.ct2_timeout))
    keep("equal", check_equal(a.device, a.tol))
    keep("sampler", check_sampler(a.device))
    keep("small", throughput(a.device, SMALL, 64, 160, 64, 64))
    if a.big:
        if a.device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True  # throughput as a user would run it
        res["tf32"] = a.device.startswith("cuda")
        keep("big", throughput(a.device, BIG, 64, 384, 128, 16))
    keep("pretrained", pretrained(a.device, a.big))
    print(json.dumps(res, indent=1))
    return 0 if res["equal"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
