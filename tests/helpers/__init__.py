"""What the tests share: the repository's folders, a tiny local model, and loading a script of the
repository (a benchmark, an example) as a module without putting its folder on ``sys.path``.

The helpers beside this file are importable (``tests.helpers.agents``) and, being importable,
usable as import paths in task files: ``agent: tests.helpers.agents:one_step``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DATA = TESTS / "data"


def stored_rollouts(run: Path) -> int:
    """How many trajectories a run directory's archive holds now (0 before it exists), read-only:
    what a test waits on before it interrupts or kills a run."""
    import sqlite3

    if not (Path(run) / "archive.sqlite").exists():
        return 0
    try:
        with sqlite3.connect(f"file:{Path(run) / 'archive.sqlite'}?mode=ro", uri=True, timeout=1) as c:
            return c.execute("SELECT COUNT(*) FROM trajectories").fetchone()[0]
    except sqlite3.Error:
        return 0


def script(path: str | Path, name: str | None = None) -> ModuleType:
    """The Python file ``path`` (relative to the repository) loaded as a module, once."""
    path = ROOT / path
    name = name or f"_script_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_tiny_llm(temperature: float):
    """A random-init tiny local model served in memory (skips without torch/peft); close() it."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from evolve.policy.local import LocalLM
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model

    cfg = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128, init_std=0.05)
    return LocalLM.from_model(
        build_model(cfg, seed=0),
        CharTokenizer(),
        name="tiny",
        temperature=temperature,
        max_tokens=16,
        batch_wait=0.001,
        max_wait=0.005,
    )


def tiny_base_and_adapter(d):
    """A tiny local model's base file ``d / "base.st"`` and a LoRA adapter ``d / "adapter.st"`` that changes
    what it says (random, seeded); skips without torch/peft."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    import copy
    import warnings

    from peft import LoraConfig, get_peft_model

    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.policy.weights import adapter_from_model, save_base

    cfg = TinyConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=128, init_std=0.05)
    model = build_model(cfg, seed=0)
    save_base(model, CharTokenizer(), cfg, d / "base.st")
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        pm = get_peft_model(
            copy.deepcopy(model),
            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        )
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    adapter_from_model(pm).save(d / "adapter.st")


def two_system_run(d):
    """A run in ``d / "run"`` with two systems whose tiny local models differ only by a LoRA adapter:
    (the run directory, system a (current), system b (a STaR child of a)). Skips without torch/peft."""
    tiny_base_and_adapter(d)
    from evolve.archive import Archive
    from evolve.types import ModelSpec, System

    with Archive(d / "run") as archive:
        base = archive.artifacts.put_file(d / "base.st", "base_weights")
        ad = archive.artifacts.put_file(d / "adapter.st", "adapter")
        params = {"temperature": 0.0, "max_tokens": 16, "batch_wait_ms": 1, "max_wait_ms": 5}
        a = System(models={"policy": ModelSpec(name="tiny", base=base, params=params)}, prompts={"v": "a"})
        b = System(models={"policy": ModelSpec(name="tiny", base=base, adapter=ad, params=params)}, prompts={"v": "b"})
        archive.add_system(a)
        archive.add_system(b, parents=[a.id], operator="star")
        archive.set_current(a.id)
    return d / "run", a, b


def greedy_answers(run_dir, systems, messages, max_tokens: int = 16) -> dict:
    """Each system's greedy answer to ``messages``, by its own local model built from the run's
    artifacts: {system id: Completion}."""
    from evolve.archive import Archive
    from evolve.policy.local import build

    want = {}
    with Archive(run_dir, create=False) as archive:
        for s in systems:
            llm = build(s.models["policy"], archive.artifacts)
            want[s.id] = llm.complete(messages, temperature=0.0, max_tokens=max_tokens)
            llm.close()
    return want
