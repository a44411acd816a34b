"""Shared by tool_layer.py and memory_layer.py: the plain cold-start system of task.yaml for one
seed, its test rollouts, and its sampled rollouts on training tasks (both memoised in the archive
of ``<out>/seed<N>/plain``, so the two experiments share them)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass
class Plain:
    seed: int
    out: Path  # <out>/seed<N>
    common: list[str]  # --set overrides every arm shares
    cfg: Any
    base: Path
    engine: Any
    system: Any
    test: list  # the test tasks
    test_trajs: list
    mine_tasks: list
    mined: list


def plain(seed: int, out: str | Path, *, mine: int, samples: int) -> Plain:
    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    root = Path(out) / f"seed{seed}"
    # the layer tables (README) were measured on task.yaml's first 300 test tasks; its test split is 2,000 now
    common = [f"seed={seed}", "operators=[]", "budget.seconds=100000", "dataset.params.n_test=300"]
    cfg, base = load_task(HERE / "task.yaml", common)
    eng = Session(cfg, base_dir=base, run_dir=root / "plain", resume=True)  # rollouts are memoised
    system = eng.baseline()
    test = eng.tasks("test")
    test_trajs = eng.rollouts(system, test, split="test", tag="eval:test")
    rng = random.Random(f"tool_layer/{seed}")
    train = eng.tasks("train")
    mine_tasks = rng.sample(train, min(mine, len(train))) if mine else []
    mined = (
        eng.rollouts(system, mine_tasks, split="train", tag="mine", samples=samples, temperature=0.8) if mine else []
    )
    eng.close()
    return Plain(seed, root, common, cfg, base, eng, system, test, test_trajs, mine_tasks, mined)
