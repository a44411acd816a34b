"""The data model: System Π, Trajectory τ, Reward r, Candidate.

All of them are frozen pydantic models that round-trip through JSON exactly
(``T.model_validate_json(x.model_dump_json()) == x``). A System's id is the hash of
its canonical JSON, so two systems with the same content are the same system.
Large parts (model weights, adapters, tool code, memory snapshots) are not inlined:
they are :class:`ArtifactRef`\\ s naming a content-addressed file in the run's
artifact store (see :mod:`evolve.artifacts`).
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JSON = Any  # a value made only of dict/list/str/int/float/bool/None


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any, n: int = 16) -> str:
    """Short sha256 of the canonical JSON of ``value`` (hex, ``n`` chars)."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:n]


# ----------------------------------------------------------------------------- system Π


class ArtifactRef(Frozen):
    """A content-addressed file in the run's artifact store."""

    sha256: str
    kind: str  # "base_weights", "adapter", "tool_code", "memory_snapshot", ...
    size: int = 0


class ModelSpec(Frozen):
    """The policy ψ behind one LLM role: a backend, a model name, and for local models the
    base weights and an optional LoRA adapter (both artifacts)."""

    backend: str = "local"  # a registered LLM backend: "local", "litellm", "scripted", ...
    name: str
    base: ArtifactRef | None = None
    adapter: ArtifactRef | None = None
    params: dict[str, JSON] = Field(default_factory=dict)  # temperature, max_tokens, ...


class System(Frozen):
    """Π = (Γ, {ψᵢ}, {Cᵢ}, {Wᵢ}). Immutable; ``id`` is the hash of the content."""

    workflow: dict[str, JSON] = Field(default_factory=dict)  # Γ: topology, agent settings
    models: dict[str, ModelSpec] = Field(default_factory=dict)  # ψ: role -> model
    prompts: dict[str, str] = Field(default_factory=dict)  # C: named prompt components
    memory: dict[str, JSON] = Field(default_factory=dict)  # C: memory store + version read
    tools: dict[str, JSON] = Field(default_factory=dict)  # W: tool library

    @cached_property
    def id(self) -> str:  # computed once per (immutable) instance
        return content_hash(self.model_dump(mode="json"))

    def replace(self, **changes: Any) -> System:
        """A new system with some top-level parts replaced (validated again)."""
        data = self.model_dump(mode="json")
        for key, value in changes.items():
            data[key] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        data["models"] = {
            k: (v.model_dump(mode="json") if isinstance(v, BaseModel) else v) for k, v in data["models"].items()
        }
        return System.model_validate(data)


# ----------------------------------------------------------------------------- trajectory τ


class Message(Frozen):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class LLMCall(Frozen):
    """One call to a model: what it saw, what it said, and (when the backend gives them)
    the exact token ids it sampled with their log-probs under the sampling temperature."""

    kind: Literal["llm"] = "llm"
    role: str  # the system's model role, e.g. "policy"
    model: str
    messages: tuple[Message, ...]
    output: str
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    temperature: float | None = None
    finish_reason: str | None = None  # "stop", "length", ...
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None  # money, when the backend reports it
    duration: float = 0.0


class ToolCall(Frozen):
    kind: Literal["tool"] = "tool"
    name: str
    args: dict[str, JSON] = Field(default_factory=dict)
    result: JSON = None
    error: str | None = None
    duration: float = 0.0


Step = Annotated[LLMCall | ToolCall, Field(discriminator="kind")]


Finite = Annotated[float, Field(allow_inf_nan=False)]


class Reward(Frozen):
    """r: a score in [0, 1] by convention (a task file may declare another ``reward_range``),
    named components, and feedback text for operators that reflect. ``error`` is set when the
    reward function itself failed. Score and components are finite numbers: NaN and inf are
    refused, so no archive, mean or test statistic ever holds one."""

    score: Finite
    components: dict[str, Finite] = Field(default_factory=dict)
    feedback: str = ""
    error: str | None = None


class InfraFailure(Frozen):
    """The world failed under a rollout, so the rollout is not a result: the engine retries it
    (``retryable``) or stops the run, and never stores it as a score.

    ``category``: ``unreachable``, ``timeout``, ``rate_limit``, ``server`` (transient: retried),
    ``worker`` (a worker process died under the rollout: retried; if it dies on every attempt the
    rollout is the agent's own failure), ``auth``, ``not_found``, ``config``, ``backend``,
    ``sandbox`` (not retried: someone has to fix something). ``source`` says who met it: the
    ``agent`` (a model call, or an exception it raised), the ``reward`` or the ``runner``."""

    category: str
    retryable: bool
    message: str
    source: Literal["agent", "reward", "runner"] = "agent"


class Trajectory(Frozen):
    """τ: one rollout of one system on one task."""

    task_id: str
    system_id: str
    steps: tuple[Step, ...] = ()
    output: JSON = None
    error: str | None = None  # the agent crashed or timed out: the message, else None
    infra: InfraFailure | None = None  # the world failed under it (then ``error`` is set too): not a result
    reward: Reward | None = None
    tokens: int = 0
    cost: float = 0.0
    duration: float = 0.0
    sample: int = 0  # index when a task is sampled several times
    temperature: float | None = None  # sampling temperature override for this rollout

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def score(self) -> float:
        return self.reward.score if self.reward is not None else 0.0


# ----------------------------------------------------------------------------- candidate


class Candidate(Frozen):
    """A proposed Π′: the system, its parents, the operator that made it and why."""

    system: System
    parents: tuple[str, ...]
    operator: str
    rationale: str = ""
    info: dict[str, JSON] = Field(default_factory=dict)  # operator statistics (e.g. kept samples)


__all__ = [
    "ArtifactRef",
    "Candidate",
    "InfraFailure",
    "LLMCall",
    "Message",
    "ModelSpec",
    "Reward",
    "Step",
    "System",
    "ToolCall",
    "Trajectory",
    "canonical_json",
    "content_hash",
]
