"""A task file written from what a client describes (the ``init_task`` tool): typed parts in,
YAML out, with the description as a comment on top. The server validates the draft as ``evolve
run`` would before it takes the file's place (:mod:`evolve.mcp.server`)."""

from __future__ import annotations

from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

MAX_YAML = 256 * 1024
Name = Annotated[str, Field(min_length=1, max_length=200)]
ImportPath = Annotated[
    str,
    Field(
        min_length=3,
        max_length=300,
        description="'module:function'; a module beside the task file works (my_agent:agent for my_agent.py)",
    ),
]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Part):
    backend: Annotated[
        str,
        Field(
            max_length=50,
            description="litellm (any hosted or served model), local (a model "
            "trained here; needed by star/grpo), or scripted (a fake for tests)",
        ),
    ] = "litellm"
    name: Annotated[
        str,
        Field(
            max_length=300,
            description="the model id, e.g. openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, hosted_vllm/Qwen2.5-7B",
        ),
    ]
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="e.g. {temperature: 0.0, max_tokens: 256, "
        "api_base: URL, api_key_env: OPENAI_API_KEY}; a litellm model names its key "
        "(api_key_env) or its server (api_base), each one the server was started with "
        "(--allow-key, --allow-host)",
    )


class DatasetSpec(_Part):
    source: Annotated[
        str | None,
        Field(
            max_length=300,
            description="import path of a function(seed, **params) -> {train: [...], val: [...], test: [...]}",
        ),
    ] = None
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of source")
    train: Annotated[
        str | None,
        Field(
            max_length=500,
            description="JSONL file (relative to the task file), one task per line, each a JSON object with an 'id'",
        ),
    ] = None
    val: Annotated[str | None, Field(max_length=500, description="JSONL file of validation tasks")] = None
    test: Annotated[str | None, Field(max_length=500, description="JSONL file of held-out test tasks")] = None


class OperatorSpec(_Part):
    name: Annotated[
        str,
        Field(
            max_length=100,
            description="prompt_mutation, reflective, bootstrap_demos, "
            "prompt_choice, memory, toolforge, topology (any model); star, grpo (local models)",
        ),
    ]
    params: dict[str, Any] = Field(default_factory=dict, description="the operator's settings (docs/ has each)")


def task_yaml(
    *,
    description: str,
    name: str,
    world: str | None,
    agent: str | None,
    reward: str | None,
    models: dict[str, ModelSpec],
    prompts: dict[str, str],
    dataset: DatasetSpec | None,
    operators: list[OperatorSpec],
    budget: dict[str, Any],
    extra: dict[str, Any],
) -> str:
    """The task file's text: the description as comments, then the fields in the reference's order."""
    data: dict[str, Any] = {"name": name}
    clash = sorted(
        set(extra) & {"name", "world", "agent", "reward", "models", "prompts", "dataset", "operators", "budget"}
    )
    if clash:
        raise ValueError(f"extra repeats {clash}; give them as their own arguments")
    if world:
        data["world"] = world
    for key, value in (("agent", agent), ("reward", reward)):
        if value:
            data[key] = value
    data["models"] = {role: m.model_dump(exclude_defaults=False) for role, m in models.items()}
    if prompts:
        data["prompts"] = dict(prompts)
    if dataset is not None:
        data["dataset"] = dataset.model_dump(exclude_none=True, exclude_defaults=True) or {}
    data["operators"] = [op.model_dump(exclude_defaults=True) for op in operators]
    if budget:
        data["budget"] = dict(budget)
    data.update(extra)
    head = "".join(f"# {line}\n" if line.strip() else "#\n" for line in description.strip().splitlines())
    text = (
        head
        + "# Written by evolve mcp (init_task). Reference: docs/task-file.md\n"
        + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)
    )
    if len(text) > MAX_YAML:
        raise ValueError(
            f"the task file would be {len(text)} bytes; the most is {MAX_YAML} (put tasks in JSONL "
            "files and name them in dataset)"
        )
    return text


__all__ = ["DatasetSpec", "ModelSpec", "OperatorSpec", "task_yaml"]
