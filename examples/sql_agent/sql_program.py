"""The SQL agent of prompts.yaml as a DSPy program, for DSPy's optimisers on the same tiny model.

One ``dspy.Predict`` over ``question, db_schema -> gold_sql`` (``db_schema`` is the task's
``schema``; the output is named after the task key so that DSPy's *labeled* demos — training
examples with their gold SQL — carry it too),
with :class:`SQLAdapter`, which sends exactly the messages the native agent sends
(:func:`evolve.worlds.sql.prompt.fewshot_messages`: the demos as masked lines before
``schema: ...\\nq: ...``, one user message) and reads the reply with the agent's ``clean_sql``.
So a demo set DSPy picks is shown to the model byte for byte as ours is. The schema is sent as
the task gives it: the layout of the schema (``prompts.yaml``'s ``prompt_choice``) is a choice
our search has and DSPy's optimisers, which search instructions and demos, do not.

The signature's instruction is *not* sent: the model was never trained with one, and an
instruction in front of the prompt only shifts its copy pointers. MIPROv2 still proposes
instructions (with the same tiny model as its prompt model; its calls are counted), but here it
searches demo sets only. Other signatures (MIPROv2's proposer modules) are formatted by DSPy's
ChatAdapter and sent as one user message clipped to its last 300 characters (the whole prompt
is thousands of tokens; the model's context is 640); when the tiny model's reply does not parse,
every output field gets the raw text, so the optimiser keeps going instead of failing on a model
that cannot write instructions.
"""

from __future__ import annotations

from typing import Any

import dspy

from evolve.prompts.dspy_interop import dspy_agent
from evolve.worlds.sql.db import clean_sql
from evolve.worlds.sql.prompt import fewshot_messages

CLIP = 300  # characters of a non-SQL prompt (MIPROv2's proposer) kept
INPUTS, OUTPUT = {"question": "question", "db_schema": "schema"}, "gold_sql"  # program argument -> task key


class WriteSQL(dspy.Signature):
    """Write one SQLite query that answers the question over the schema."""

    question: str = dspy.InputField()
    db_schema: str = dspy.InputField(desc="tables as name(column, ...)")
    gold_sql: str = dspy.OutputField(desc="one select query")


def _is_sql(signature: Any) -> bool:
    return set(signature.input_fields) == set(INPUTS) and list(signature.output_fields) == [OUTPUT]


def _plain(d: Any) -> dict:
    return d.toDict() if hasattr(d, "toDict") else dict(d)


class SQLAdapter(dspy.Adapter):
    """The native agent's message format for :class:`WriteSQL`; DSPy's ChatAdapter for anything else."""

    def __init__(self) -> None:
        super().__init__()
        self.chat = dspy.ChatAdapter(use_json_adapter_fallback=False)

    def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        if not _is_sql(signature):  # one user message, clipped to its end: the model's context is 640 tokens
            text = "\n\n".join(str(m.get("content", "")) for m in self.chat.format(signature, demos, inputs))
            return [{"role": "user", "content": text[-CLIP:]}]
        shown = [d for d in map(_plain, demos) if d.get(OUTPUT) and d.get("question")]
        task = {"schema": inputs["db_schema"], "question": inputs["question"]}
        return [{"role": m.role, "content": m.content} for m in fewshot_messages(task, shown)]

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        if _is_sql(signature):
            return {OUTPUT: clean_sql(completion)}
        try:
            return self.chat.parse(signature, completion)
        except Exception:  # noqa: BLE001 - a tiny model cannot follow the ChatAdapter's format
            return {k: " ".join(str(completion).split())[:500] for k in signature.output_fields}


class SQLProgram(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.write = dspy.Predict(WriteSQL)

    def forward(self, question: str, db_schema: str) -> dspy.Prediction:
        return self.write(question=question, db_schema=db_schema)


def make_program() -> SQLProgram:
    return SQLProgram()


agent = dspy_agent(make_program, inputs=INPUTS, output=OUTPUT, adapter=SQLAdapter())
