"""Topology layer Γ: workflow graphs that run (:mod:`.graph`, :mod:`.runtime`, :mod:`.nodes`) and
MCTS search over graph edits (:mod:`.search`, :mod:`.edits`, :mod:`.operator`)."""

from evolve.topology.graph import (Edge, Node, Workflow, WorkflowError, compile_condition, condition_holds,
                                   diff_workflows, graph_of, to_text, validate)
from evolve.topology.runtime import NodeError, Runtime, agent, calls_upper_bound

__all__ = ["Edge", "Node", "NodeError", "Runtime", "Workflow", "WorkflowError", "agent", "calls_upper_bound",
           "compile_condition", "condition_holds", "diff_workflows", "graph_of", "to_text", "validate"]
