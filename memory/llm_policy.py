"""Deprecated: the LLM memory curator is :class:`evolve.memory.llm_curator.LLMCurator` (``LLMPolicy``
before; "policy" names the weights layer). This module re-exports it and warns."""

from __future__ import annotations

import warnings

from .llm_curator import LLMCurator

LLMPolicy = LLMCurator

warnings.warn(
    "evolve.memory.llm_policy is deprecated: import LLMCurator from evolve.memory (or evolve.memory.llm_curator)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["LLMPolicy"]
