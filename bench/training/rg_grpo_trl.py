"""GRPO on reasoning-gym: evolvekit's operator beside TRL's ``GRPOTrainer``, on the same work (issue 52 item 4).

Both sides start from the same system, the SFT cold start of ``examples/reasoning_gym/task.yaml``
(SmolLM2-135M-Instruct + its LoRA adapter), and continue that adapter with one generation batch:
the same 200 training tasks, groups of 4 completions at T 0.6 (at most 48 tokens, ended by the
model's end of turn or a blank line), then 8 optimiser steps (2 passes of 4 minibatches of 200
completions), ``loss_type="dapo"`` with clipping 0.2/0.28, no KL term, group-normalised advantages,
AdamW (betas 0.9/0.99) at lr 1e-4 with our linear warmup over 2 steps, gradient clipping at 1.

* **ours**: ``evolve run examples/reasoning_gym/task.yaml`` with the ``grpo`` operator
  (``dev_tasks: 0``: the child is the last step, as TRL's is); the run scores the SFT system on
  test, and this script scores the GRPO child there.
* **trl**: TRL 1.16's ``GRPOTrainer`` in its own process, on the SFT system's weights read from
  that run's archive (base + adapter, the adapter trainable), the prompts our agent sends
  (rendered by the same chat template), the 200 tasks our side trained on, and our reward
  (reasoning-gym's scorer on the reply's ``Answer:`` line). TRL samples with transformers'
  ``generate``; the optimiser and its schedule are handed to it, so both sides step alike. Its
  adapter goes into the run's archive as a child of the SFT system (operator ``trl_grpo``) and is
  scored on test by ``evolve eval``'s code path, the same as ours.

Wall and CPU seconds are the sampling and training of the one batch on each side (ours: the
operator's rollouts and updates; TRL: ``trainer.train()``), each side alone on the machine.

    .venv/bin/pip install trl==1.16.0      # the bench needs TRL; evolvekit does not
    .venv/bin/python bench/training/rg_grpo_trl.py --out runs/rg_trl --seed 0     # both sides, then the scores
    .venv/bin/python bench/training/rg_grpo_trl.py --out runs/rg_trl --seed 0 --only score   # scores again
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "reasoning_gym" / "task.yaml"
TASKS, GROUP, TEMPERATURE, LR, WARMUP, MINIBATCHES, ITERATIONS, MAX_TOKENS = 200, 4, 0.6, 1e-4, 2, 4, 2, 48
GRPO = (
    f"{{name: grpo, params: {{steps: 1, tasks_per_step: {TASKS}, group_size: {GROUP}, temperature: {TEMPERATURE}, "
    f"lr: {LR}, warmup: {WARMUP}, minibatches: {MINIBATCHES}, num_iterations: {ITERATIONS}, beta: 0.0, "
    "loss_type: dapo, estimator: grpo, dev_tasks: 0}}"
)


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def grpo_record(archive):
    """The run's GRPO child (its parent is the SFT system both sides start from)."""
    return next(r for r in archive.records() if r.operator == "grpo")


def overrides(seed: int) -> list[str]:
    # the fixed mix, as measured (the task file now runs a curriculum)
    return [f"seed={seed}", f"operators=[{GRPO}]", "budget.generations=1", "engine.curriculum=null"]


def sets(seed: int) -> list[str]:
    return [a for o in overrides(seed) for a in ("--set", o)]


# ------------------------------------------------------------------------------------------ ours


def run_ours(out: Path, seed: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "ANONYMIZED_TELEMETRY": "False"}
    cmd = [sys.executable, "-m", "evolve", "run", str(TASK), "--out", str(out), "--fresh", *sets(seed)]
    t0, c0 = time.perf_counter(), cpu_children()
    subprocess.run(cmd, check=True, env=env)
    wall, cpu = time.perf_counter() - t0, cpu_children() - c0
    from evolve.archive import Archive

    with Archive(out, create=False) as a:
        rec = grpo_record(a)
    curve = rec.info["curve"]
    step = curve[-1]  # no dev checks (dev_tasks: 0): the one step
    return {
        "child": rec.id,
        "grpo_seconds": rec.info["seconds"],
        "rollout_s": step["rollout_s"],
        "train_s": step["train_s"],
        "run_wall_s": round(wall, 1),
        "run_cpu_s": round(cpu, 1),
        "groups_kept": step.get("groups_kept"),
        "groups": step.get("groups"),
        "reward": step.get("reward"),
    }


# ------------------------------------------------------------------------------------------- trl


def run_trl(out: Path, seed: int) -> dict:
    """In its own process (``--only trl``): TRL's trainer on the SFT system of ``out``'s run."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from evolve.archive import Archive
    from evolve.artifacts import ArtifactStore
    from evolve.policy.weights import (
        attach_adapter,
        load_base,
        read_adapter,
        save_adapter,
    )
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.worlds.reasoning_gym.agent import messages_for
    from evolve.worlds.reasoning_gym.reward import reward

    torch.set_num_threads(os.cpu_count() or 1)
    cfg, base_dir = load_task(TASK, overrides(seed))
    session = Session(cfg, base_dir=base_dir, run_dir=out, resume=True, evaluating=True)
    try:
        train = {t["id"]: t for t in session.tasks("train")}
    finally:
        session.close()
    with Archive(out, create=False) as a:
        rec = grpo_record(a)
        parent = a.get_system(rec.parents[0])
        # the tasks our side trained on: its GRPO rollouts (phase "grpo") of the parent
        ids = sorted({r.trajectory.task_id for r in a.trajectory_rows(parent.id, "train", "grpo")})
    assert len(ids) == TASKS, f"expected {TASKS} GRPO tasks in the run, found {len(ids)}"
    store = ArtifactStore(out / "artifacts")
    spec = parent.models["policy"]
    model, tok, _ = load_base(store.path(spec.base), device="cpu", dtype="float32")
    model = attach_adapter(model, read_adapter(store.path(spec.adapter)))
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    model.train()
    hf = tok.tok
    # our agent stops a reply at a blank line (workflow.stop) or the end of turn: TRL stops and
    # masks at its eos ids, so the blank-line token joins them
    nn = hf.encode("\n\n", add_special_tokens=False)
    assert len(nn) == 1, f"'\\n\\n' is {nn} here, not one token"
    model.generation_config.eos_token_id = [*tok.eos_ids, nn[0]]
    if hf.pad_token is None:
        hf.pad_token = hf.eos_token
    prompts = [
        hf.apply_chat_template(
            [m.model_dump(include={"role", "content"}) for m in messages_for(train[i], parent.prompts)],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in ids
    ]
    # the same ids our sampler starts from (our HFTokenizer.render_chat)
    assert hf(prompts[0], add_special_tokens=False)["input_ids"] == tok.render_chat(
        messages_for(train[ids[0]], parent.prompts)
    )
    data = Dataset.from_dict({"prompt": prompts, "task_id": ids})

    def score(prompts, completions, task_id, **_):
        return [reward(train[t], c.split("\n\n")[0]).score for c, t in zip(completions, task_id)]

    micro = 8  # sequences per forward pass; 25 of them make one optimiser step of 200 completions
    accum = TASKS * GROUP // MINIBATCHES // micro
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        generation_batch_size=TASKS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        num_iterations=ITERATIONS,
        max_steps=MINIBATCHES * ITERATIONS,
        learning_rate=LR,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        max_grad_norm=1.0,
        weight_decay=0.0,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=seed,
        disable_tqdm=True,
    )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / WARMUP))
    trainer = GRPOTrainer(
        model=model, reward_funcs=score, args=args, train_dataset=data, processing_class=hf, optimizers=(opt, sched)
    )
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    path = out / "trl" / "adapter.safetensors"
    save_adapter(trainer.model, "default", path)
    ref = store.put_file(path, "adapter")
    child = parent.replace(models={**parent.models, "policy": spec.model_copy(update={"adapter": ref})})
    with Archive(out) as a:
        sid = a.add_system(
            child,
            parents=[parent.id],
            operator="trl_grpo",
            generation=1,
            rationale="TRL 1.16 GRPOTrainer on the parent's adapter (bench/training/rg_grpo_trl.py)",
            info={"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)},
        )
    return {
        "child": sid,
        "train_wall_s": round(wall, 1),
        "train_cpu_s": round(cpu, 1),
        "optimizer_steps": len(logs),
        "reward": logs[0].get("reward") if logs else None,
        "log": logs,
    }


# ----------------------------------------------------------------------------------------- score


def score(out: Path, seed: int, res: dict) -> dict:
    from evolve.api import evaluate
    from evolve.archive import Archive
    from evolve.results.stats import describe, paired

    with Archive(out, create=False) as a:
        base = grpo_record(a).parents[0]
    rows = {}
    sides = [side for side in ("ours", "trl") if side in res]
    for side in sides:
        evaluate(TASK, out, system=res[side]["child"], split="test", overrides=overrides(seed))
    with Archive(out, create=False) as a:
        sft = a.task_scores(base, "test")
        rows["sft_test"] = sum(sft.values()) / len(sft)
        for side in sides:
            child = a.task_scores(res[side]["child"], "test")
            c = paired(sft, child)
            rows[side] = {"test": sum(child.values()) / len(child), "gain": describe(c), "paired": c}
        if len(sides) == 2:
            rows["trl_vs_ours"] = describe(
                paired(a.task_scores(res["trl"]["child"], "test"), a.task_scores(res["ours"]["child"], "test"))
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "rg_trl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=["ours", "trl", "score"], default=None)
    a = ap.parse_args()
    out = (a.out / f"seed{a.seed}").resolve()
    res_path = out.parent / f"seed{a.seed}.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    if a.only in (None, "ours"):
        res["ours"] = run_ours(out, a.seed)
        res_path.write_text(json.dumps(res, indent=1))
    if a.only == "trl":  # in its own process (peak memory and CPU time are its own)
        res["trl"] = run_trl(out, a.seed)
        res_path.write_text(json.dumps(res, indent=1))
    if a.only is None:
        subprocess.run(
            [sys.executable, __file__, "--out", str(a.out), "--seed", str(a.seed), "--only", "trl"], check=True
        )
        res = json.loads(res_path.read_text())
    if a.only in (None, "score"):
        res["scores"] = score(out, a.seed, res)
        res_path.write_text(json.dumps(res, indent=1))
    s = res.get("scores", {})
    for side in ("ours", "trl"):
        if side in res:
            r = res[side]
            secs = r.get("grpo_seconds", r.get("train_wall_s"))
            print(
                f"{side}: {secs} s; test {100 * s[side]['test']:.1f}% ({s[side]['gain']})"
                if side in s
                else f"{side}: {r}"
            )
    if s:
        print(
            f"SFT test {100 * s['sft_test']:.1f}%"
            + (f"; ours against TRL: {s['trl_vs_ours']}" if "trl_vs_ours" in s else "")
        )


if __name__ == "__main__":
    main()
