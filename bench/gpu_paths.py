"""Imports for the bench scripts that also run on the GPU machine, whose image has no pip install of
this checkout: the checkout's root on ``sys.path`` (for ``evolve``) and ``policy/`` mapped in as
``evolve.policy`` (pyproject's package-dir does that for an installed copy)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def map_policy_package() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import evolve.policy  # noqa: F401
    except ModuleNotFoundError:
        spec = importlib.util.spec_from_file_location(
            "evolve.policy", ROOT / "policy" / "__init__.py", submodule_search_locations=[str(ROOT / "policy")]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["evolve.policy"] = mod
        spec.loader.exec_module(mod)
