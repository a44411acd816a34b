"""The one way to build a model from its spec, and to keep what was built.

:func:`build_llm` looks the spec's backend up in :data:`evolve.registry.llm_backends` and calls its
factory with the run's artifact store (where a local model's weights and adapters are).
:class:`LLMCache` builds each distinct spec once (its canonical JSON is the key), from many threads
at once, keeps at most ``max_size`` of them (the oldest is closed first) and closes them all in
:meth:`LLMCache.close`. The rollout workers, Reflexion, the prompt and tool operators' own models and
``evolve serve`` all build their models here.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Any

from evolve.types import ModelSpec, canonical_json


def build_llm(spec: ModelSpec, artifacts: Any) -> Any:
    """A new :class:`~evolve.llm.base.LLM` for ``spec`` (its backend's factory; not cached)."""
    from evolve.registry import llm_backends

    return llm_backends.get(spec.backend)(spec, artifacts)


class LLMCache:
    """Each distinct model spec's LLM, built once (see the module docstring). Thread-safe."""

    def __init__(self, artifacts: Any, *, max_size: int | None = None) -> None:
        self.artifacts = artifacts
        self.max_size = max_size
        self._llms: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def peek(self, spec: ModelSpec) -> Any | None:
        """The LLM already built for ``spec``, or None (builds nothing)."""
        return self._llms.get(canonical_json(spec.model_dump(mode="json")))

    def get(self, spec: ModelSpec) -> Any:
        """The LLM for ``spec``, built on the first call."""
        key = canonical_json(spec.model_dump(mode="json"))
        with self._lock:
            llm = self._llms.get(key)
            if llm is None:
                llm = self._llms[key] = build_llm(spec, self.artifacts)
                while self.max_size is not None and len(self._llms) > self.max_size:
                    _, old = self._llms.popitem(last=False)
                    with contextlib.suppress(Exception):  # closing must not fail a run
                        old.close()
            return llm

    def close(self) -> None:
        """Close every LLM built (errors are ignored: closing must not fail a run)."""
        with self._lock:
            llms, self._llms = list(self._llms.values()), OrderedDict()
        for llm in llms:
            with contextlib.suppress(Exception):
                llm.close()

    def __len__(self) -> int:
        return len(self._llms)


__all__ = ["LLMCache", "build_llm"]
