"""Deprecated: the ``from_traces`` operator is in :mod:`evolve.policy.from_traces` (named for the
operator; ``evolve.gateway.traces`` is the trace store, another thing). This module re-exports it
and warns."""

from __future__ import annotations

import warnings

from evolve.policy.from_traces import FromTraces

warnings.warn(
    "evolve.policy.traces is deprecated: import FromTraces from evolve.policy.from_traces",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["FromTraces"]
