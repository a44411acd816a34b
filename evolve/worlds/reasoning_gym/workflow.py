"""The agent as a workflow graph of generic steps (:mod:`evolve.topology`), and the palette the
topology search adds to it.

:func:`single_step` is the agent's one call: an ``llm`` step (the question under the
``instruction`` component; no demos or memory: the hand-written :func:`~evolve.worlds.reasoning_gym.agent`
shows those), a ``tool`` step that reads the answer in the task's format (``answer``, or
``extract_error`` with why not), and an ``answer`` step that returns ``{reply, answer, extract_error}``
as the agent does, so the reward scores both alike.

:data:`PALETTE`: ``vote`` wraps the two steps into self-consistency (``n`` sampled replies, the
most common answer wins; replies with no answer do not vote unless none has one); ``reformat`` is a
loop at the reading step: when no answer could be read, the model is shown its reply and asked for
the answer line alone (once or twice). Neither tells the model anything about the gold answer.
"""

from __future__ import annotations

from typing import Any

READ = "evolve.worlds.reasoning_gym:read_answer"
REFORMAT_PROMPT = (
    "Your reply did not give the final answer in the required format. Reply with the final answer "
    "alone, as the instructions say (for example 'Answer: 42'), and nothing else."
)


def single_step(max_tokens: int | None = None) -> dict[str, Any]:
    """Ask, read the answer, answer (JSON for ``System.workflow["graph"]``)."""
    solve: dict[str, Any] = {"prompt": "{question}", "system": "instruction", "history": True, "out": "reply"}
    if max_tokens:
        solve["max_tokens"] = max_tokens
    return {
        "entry": "solve",
        "nodes": [
            {"id": "solve", "type": "llm", "params": solve},
            {
                "id": "read",
                "type": "tool",
                "params": {
                    "fn": READ,
                    "args": {"reply": "reply", "answer_format": "answer_format"},
                    "out": "answer",
                    "name": "read_answer",
                    "error_key": "extract_error",
                },
            },
            {"id": "answer", "type": "answer", "params": {"fields": ["reply", "answer", "extract_error"]}},
        ],
        "edges": [{"src": "solve", "dst": "read"}, {"src": "read", "dst": "answer"}],
    }


#: The palette the topology search uses on this world (see :mod:`evolve.topology.edits`).
PALETTE: list[dict[str, Any]] = [
    {
        "name": "vote",
        "kind": "wrap",
        "chain_types": ["llm", "tool"],
        "params": {"key": "answer", "exclude_when": "extract_error"},
        "grid": {"n": [5, 3, 8], "temperature": [0.7, 0.5, 1.0]},
    },
    {
        "name": "reformat",
        "type": "llm",
        "kind": "loop",
        "at": "tool",
        "when": ["extract_error"],
        "max_visits": [1, 2],
        "params": {"prompt": REFORMAT_PROMPT, "system": "instruction", "history": True, "out": "reply"},
    },
]

__all__ = ["PALETTE", "READ", "REFORMAT_PROMPT", "single_step"]
