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
    return LocalLM.from_model(build_model(cfg, seed=0), CharTokenizer(), name="tiny", temperature=temperature,
                              max_tokens=16, batch_wait=0.001, max_wait=0.005)
