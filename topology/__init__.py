"""Topology layer Γ: workflow graphs that run, and MCTS search over graph edits.

* graphs — ``graph`` (the Workflow, validation, diffs), ``conditions`` (edge conditions),
  ``base`` (the NodeType protocol), ``nodes`` (llm, tool, check, vote, reflect, answer steps), ``runtime`` (running a graph as the
  agent; the call bound budgets use), ``render`` (text and PNG);
* search — ``palette`` (what may be inserted), ``edits`` (add, remove, replace, rewire),
  ``search`` (MCTS with per-parent experience), ``operator`` (the ``topology`` operator);
* ``report`` — the workflow section of a run's report and of ``evolve archive show``.
"""

from evolve.topology.graph import (
    Edge,
    Node,
    Workflow,
    WorkflowError,
    compile_condition,
    condition_holds,
    diff_workflows,
    graph_of,
    to_text,
    validate,
)
from evolve.topology.runtime import NodeError, Runtime, agent, calls_upper_bound

__all__ = [
    "Edge",
    "Node",
    "NodeError",
    "Runtime",
    "Workflow",
    "WorkflowError",
    "agent",
    "calls_upper_bound",
    "compile_condition",
    "condition_holds",
    "diff_workflows",
    "graph_of",
    "to_text",
    "validate",
]
