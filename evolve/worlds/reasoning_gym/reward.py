"""The reward: reasoning-gym's own scorer on the answer read from the reply.

Components ``extracted`` (an answer could be read in the task's format) and ``correct`` (the
scorer gave 1). Feedback, read by the reflective operators and by Reflexion's next attempt:

* ``no answer could be read: no 'Answer: ...' line in the reply`` (score 0);
* ``correct: answered '42'``;
* ``wrong: answered '41' (basic_arithmetic's scorer gives 0.00); the expected answer is an integer``.

The gold answer is never in the feedback, on any split: Reflexion shows the feedback to the model
within a rollout, on validation and test tasks too, and a reflective mutation could copy it into
a prompt; either would let a system be scored on answers it was told. Only what the gold answer
*is* (an integer, one word, a list, ...) is said.
"""

from __future__ import annotations

from typing import Any

from evolve.types import Reward
from evolve.worlds.reasoning_gym.answer import AnswerFormatError, extract, kind_of
from evolve.worlds.reasoning_gym.generators import score


def _shown(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def answer_of(task: dict, output: Any) -> tuple[str | None, str | None]:
    """``(answer, why none)`` of an output: the agent's ``{"answer", "extract_error"}`` dict, or a
    reply string read in the task's ``answer_format``."""
    if isinstance(output, dict) and "answer" in output:
        answer = output.get("answer")
        if isinstance(answer, str) and answer.strip():
            return answer, None
        return None, str(output.get("extract_error") or "the output holds no answer")
    reply = output.get("reply") if isinstance(output, dict) else output
    try:
        return extract(reply if isinstance(reply, str) else None, task.get("answer_format", "answer_line")), None
    except AnswerFormatError as e:
        return None, str(e)


def reward(task: dict, output: Any, trajectory: Any = None) -> Reward:
    """The package's score (0..1) of the extracted answer (see the module docstring); never raises
    on a malformed output."""
    answer, why = answer_of(task, output)
    if answer is None:
        return Reward(
            score=0.0, components={"extracted": 0.0, "correct": 0.0}, feedback=f"no answer could be read: {why}"
        )
    try:
        got = score(task, answer)
    except Exception as e:  # noqa: BLE001 - a broken task or scorer is the reward's own failure
        return Reward(
            score=0.0,
            components={"extracted": 1.0, "correct": 0.0},
            feedback="the scorer failed",
            error=f"{type(e).__name__}: {e}",
        )
    got = min(1.0, max(0.0, got))
    if got >= 1.0:
        return Reward(
            score=1.0, components={"extracted": 1.0, "correct": 1.0}, feedback=f"correct: answered {_shown(answer)}"
        )
    feedback = (
        f"wrong: answered {_shown(answer)} ({task['generator']}'s scorer gives {got:.2f}); "
        f"the expected answer is {kind_of(task.get('answer'))}"
    )
    return Reward(score=got, components={"extracted": 1.0, "correct": 0.0}, feedback=feedback)


__all__ = ["answer_of", "reward"]
