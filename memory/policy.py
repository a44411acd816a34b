"""Deprecated: the heuristic memory curator and ``apply`` are in :mod:`evolve.memory.curator`
(``HeuristicPolicy`` is :class:`~evolve.memory.curator.HeuristicCurator`; "policy" names the
weights layer). This module re-exports them and warns."""

from __future__ import annotations

import warnings

from .curator import HeuristicCurator, apply

HeuristicPolicy = HeuristicCurator

warnings.warn(
    "evolve.memory.policy is deprecated: import HeuristicCurator and apply from evolve.memory "
    "(or evolve.memory.curator)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["HeuristicPolicy", "apply"]
