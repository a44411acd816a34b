"""The prompt layer: evolve the named prompt components of a system's context C.

* :mod:`evolve.prompts.components` — the convention for ``System.prompts`` keys
  (``"<step>.<kind>"``, kinds instruction | demos | format | template | mutator | task), the
  validated view ``components.components(system)``, typed getters and setters,
  :func:`diff_prompts`, :func:`render_demos` (re-exported here, except ``components`` itself,
  which would hide the submodule of the same name);
* operators (register them under these names in :data:`evolve.registry.operators`):

  - ``prompt_mutation`` — :class:`~evolve.prompts.mutation.PromptMutation`, LLM mutation with
    evolving mutation prompts, hyper-mutation and zero-order generation (PromptBreeder);
  - ``reflective`` — :class:`~evolve.prompts.reflective.ReflectiveMutation`, a component
    rewritten by an LLM that reads failed trajectories and their reward feedback (GEPA);
  - ``bootstrap_demos`` — :class:`~evolve.prompts.bootstrap.DemoBootstrap`, few-shot demos
    from the system's own successes, the selection being the searched choice (DSPy);
  - ``prompt_crossover`` — :class:`~evolve.prompts.crossover.Crossover`, two lineages merged
    component by component (GEPA's merge);
  - ``prompt_choice`` — :class:`~evolve.prompts.choices.PromptChoice`, alternatives the task
    file declares for any component (a template, a format, instructions to A/B), judged by the
    engine like every child;

* the per-task Pareto front GEPA samples parents from is :mod:`evolve.loop.pareto` (the ``pareto`` selector uses it too).

Submodules import lazily: ``import evolve.prompts`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from evolve.loop.pareto import best_counts, pareto_front, sample_from_front
from evolve.prompts.components import (
    Component,
    ComponentError,
    diff_prompts,
    get_demos,
    get_format,
    get_instruction,
    get_mutators,
    get_task,
    get_template,
    get_text,
    render_demos,
    set_demos,
    set_format,
    set_instruction,
    set_mutators,
    set_template,
    set_text,
)

_LAZY = {
    "PromptMutation": "evolve.prompts.mutation",
    "ReflectiveMutation": "evolve.prompts.reflective",
    "DemoBootstrap": "evolve.prompts.bootstrap",
    "Crossover": "evolve.prompts.crossover",
    "PromptChoice": "evolve.prompts.choices",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'evolve.prompts' has no attribute {name!r}")


__all__ = [
    "Component",
    "ComponentError",
    "Crossover",
    "DemoBootstrap",
    "PromptChoice",
    "PromptMutation",
    "ReflectiveMutation",
    "best_counts",
    "diff_prompts",
    "get_demos",
    "get_format",
    "get_instruction",
    "get_mutators",
    "get_task",
    "get_template",
    "get_text",
    "pareto_front",
    "render_demos",
    "sample_from_front",
    "set_demos",
    "set_format",
    "set_instruction",
    "set_mutators",
    "set_template",
    "set_text",
]
