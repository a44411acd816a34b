"""Deprecated: accepting and promoting children is :mod:`evolve.loop.acceptance` (``evolve.gateway.judge``
is the LLM judge, another thing). This module re-exports it and warns."""

from __future__ import annotations

import warnings

from evolve.loop.acceptance import Verdict, judge, paired_judge, paired_promotion, promotion, refine, stage1

warnings.warn("evolve.loop.judge is deprecated: import from evolve.loop.acceptance", DeprecationWarning, stacklevel=2)

__all__ = ["Verdict", "judge", "paired_judge", "paired_promotion", "promotion", "refine", "stage1"]
