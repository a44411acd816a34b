"""Deprecated: the loop's acceptance, minibatch sampler and stopping rule are in
:mod:`evolve.loop.strategies` ("policy" names the weights layer); ``build_policies`` is
:func:`~evolve.loop.strategies.build_strategies`. This module re-exports them and warns."""

from __future__ import annotations

import warnings

from evolve.loop.strategies import (
    Acceptance,
    BudgetOnly,
    FixedMinibatch,
    MinibatchSampler,
    Paired,
    Plateau,
    RandomMinibatch,
    Stopping,
    TwoStage,
    ValOnly,
    build_strategies,
)

build_policies = build_strategies

warnings.warn(
    "evolve.loop.policies is deprecated: import from evolve.loop.strategies (build_policies is build_strategies there)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "Acceptance",
    "BudgetOnly",
    "FixedMinibatch",
    "MinibatchSampler",
    "Paired",
    "Plateau",
    "RandomMinibatch",
    "Stopping",
    "TwoStage",
    "ValOnly",
    "build_policies",
]
