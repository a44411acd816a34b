"""A small DSPy program as the agent of task.yaml: short factual questions with exact answers.

The program is one ``dspy.ChainOfThought`` predictor named ``solve``; its prompt components in
the evolved system are ``solve.predict.instruction`` and ``solve.predict.demos``. The reward is an
exact match after normalisation (case, accents, punctuation, a leading article, number forms),
with feedback text the reflective operators and GEPA read.
"""

from __future__ import annotations

import re
import unicodedata

import dspy

from evolve.prompts.dspy_interop import dspy_agent
from evolve.types import Reward


class ShortAnswer(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="often a single word, name or number")


class QA(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.ChainOfThought(ShortAnswer)

    def forward(self, question: str) -> dspy.Prediction:
        return self.solve(question=question)


def make_program() -> QA:
    return QA()


agent = dspy_agent(make_program, inputs=["question"], output="answer")


def normalise(text: object) -> str:
    s = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode().lower().strip()
    s = re.sub(r"[^\w\s.%-]", " ", s)
    s = re.sub(r"^(the|a|an)\s+", "", s.strip())
    s = " ".join(s.split()).rstrip(".")
    try:
        return format(float(s.replace(",", "")), "g")
    except ValueError:
        return s


def reward(task: dict, output: object) -> Reward:
    expected = [task["answer"], *task.get("aliases", [])]
    got = normalise(output)
    if any(got == normalise(e) for e in expected):
        return Reward(score=1.0, feedback="correct")
    return Reward(score=0.0, feedback=f"expected exactly {task['answer']!r} (the answer alone), got {str(output)!r}")
