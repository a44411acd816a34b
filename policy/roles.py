"""Training a team role by role: which roles a weight operator trains, in what order, with what credit.

A system whose workflow has several model roles on one local base (``models: {solver: ...,
verifier: ...}``, each with ``backend: local`` and the same weights) holds one LoRA adapter per
role: ``System.models[role].adapter``. A child that retrains one role keeps the others' adapters
by reference (the same artifact), and the local backend serves every role's adapter from one base
in memory (:mod:`evolve.policy.local`; CTranslate2: one converted entry per adapter in one cache).

STaR and GRPO take the same settings (:class:`RoleParams`):

* ``roles``: one role name, a list, or ``all`` (every local role of the parent with base weights);
  unset: ``role`` (default ``policy``), the single-role setting;
* ``schedule``: ``joint`` trains every listed role in each proposal, each on its own turns of the
  same team rollouts; ``alternate`` trains one role per generation, in the listed order (MARTI's
  alternating schedule: the first generation trains ``roles[0]``, the next ``roles[1]``, ..., the
  others stay frozen meanwhile);
* ``credit``: role -> ``outcome`` or ``verdict``. ``outcome`` (a solver, writer, planner) learns
  from the team's reward. ``verdict`` (a judge, verifier, critic) learns whether its verdict matched
  the truth of the answer it judged, as MARTI rewards a verifier: accepting a right answer or
  rejecting a wrong one earns 1, the opposite 0, so a judge that always says "correct" is rewarded
  on right answers only. Roles named like a judge (:data:`VERDICT_ROLES`) default to ``verdict``.

A verdict is read from the judge's reply by :func:`verdict` (the first of an accepting or a
rejecting word); the answer it judged is the last reply of another role before it. Its truth comes
from scores the run already has, never from a new reward call: the answer is the rollout's final
output (its score), or the final output of another rollout of the same task in the batch. A
verdict on an answer no rollout submitted is context, not trained (counted as ``unjudged``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evolve.errors import ConfigError
from evolve.types import LLMCall, Trajectory

Credit = Literal["outcome", "verdict"]
Schedule = Literal["joint", "alternate"]

#: Role names whose credit defaults to ``verdict`` (a role whose job is to judge another's answer).
VERDICT_ROLES: tuple[str, ...] = ("judge", "verifier", "critic", "reviewer", "checker", "grader")

_ACCEPT = r"correct|right|yes|accept(?:ed)?|approved?|valid|true"
_REJECT = r"incorrect|wrong|no|not|reject(?:ed)?|invalid|false"
_VERDICT = re.compile(rf"\b(?:(?P<reject>{_REJECT})|(?P<accept>{_ACCEPT}))\b", re.IGNORECASE)


class RoleParams(BaseModel):
    """The role settings STaR and GRPO share (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: str = Field("policy", description="the model role trained when roles is not given")
    roles: str | list[str] | None = Field(
        None,
        description=("the roles trained: one name, a list, or 'all' (every local role with base weights); null: role"),
    )
    schedule: Schedule = Field(
        "joint",
        description=(
            "joint: every listed role in each proposal; alternate: one role per generation, in the listed order"
        ),
    )
    credit: dict[str, Credit] = Field(
        default_factory=dict,
        description=(
            "role -> outcome (the team's reward) or verdict (1 when the role's verdict matched the truth of the "
            f"answer it judged); default: verdict for roles named {', '.join(VERDICT_ROLES)}, else outcome"
        ),
    )

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list):
            if not v:
                raise ValueError("roles is empty: give a role name, a list of them, or 'all'")
            dup = sorted({r for r in v if v.count(r) > 1})
            if dup:
                raise ValueError(f"roles lists {', '.join(map(repr, dup))} more than once")
            if "all" in v:
                raise ValueError("'all' stands alone: roles: all, not inside a list")
        return v

    @model_validator(mode="after")
    def _one_spelling(self) -> RoleParams:
        if self.roles is not None and "role" in self.model_fields_set:
            raise ValueError("give roles (one, a list, or all) or role, not both")
        return self

    def names(self) -> list[str] | Literal["all"]:
        """The roles asked for: a list of names, or ``"all"``."""
        if self.roles is None:
            return [self.role]
        if self.roles == "all":
            return "all"
        return [self.roles] if isinstance(self.roles, str) else list(self.roles)

    def credit_of(self, role: str) -> Credit:
        return self.credit.get(role) or default_credit(role)


def default_credit(role: str) -> Credit:
    """``verdict`` for a role named like a judge (``verifier``, ``judge_2``, ``code-reviewer``), else ``outcome``."""
    words = re.split(r"[^a-z]+", role.lower())
    return "verdict" if any(w in VERDICT_ROLES for w in words) else "outcome"


def check_roles(params: RoleParams, models: Mapping[str, Any], *, what: str = "roles") -> None:
    """Refuse role names the system does not have, and named roles no weight operator can train
    (``models``: role -> a task file's model entry or a :class:`~evolve.types.ModelSpec`, each with a
    ``backend``). Raises ConfigError naming the roles that exist."""
    asked = params.names()
    have = ", ".join(sorted(models)) or "none"
    names = [] if asked == "all" else asked
    for r in names:
        if r not in models:
            raise ConfigError(f"{what}: unknown role {r!r}; the system's roles are {have}")
        backend = getattr(models[r], "backend", None)
        if backend is not None and backend != "local":
            raise ConfigError(
                f"{what}: role {r!r} is a {backend} model; only local models (backend: local) "
                f"train adapters; the local roles are {', '.join(_local(models)) or 'none'}"
            )
    for r in params.credit:
        if r not in models:
            raise ConfigError(f"credit: unknown role {r!r}; the system's roles are {have}")
    if asked == "all" and not _local(models):
        raise ConfigError(f"{what}: all, but no role is a local model (backend: local); the roles are {have}")


def _local(models: Mapping[str, Any]) -> list[str]:
    return [r for r, m in models.items() if getattr(m, "backend", None) == "local"]


def trained_roles(params: RoleParams, models: Mapping[str, Any], generation: int) -> list[str]:
    """The roles one proposal trains: every asked role (``joint``), or in generation ``generation``
    (the engine counts from 1) the one whose turn it is (``alternate``). ``all`` is the local roles
    with base weights, in the order the system lists them."""
    if params.roles is not None or params.credit:  # the single-role default keeps its old leniency
        check_roles(params, models)
    asked = params.names()
    roles = (
        [r for r, m in models.items() if getattr(m, "backend", None) == "local" and getattr(m, "base", None)]
        if asked == "all"
        else asked
    )
    if params.schedule == "alternate" and roles:
        return [roles[(max(generation, 1) - 1) % len(roles)]]  # the engine's first generation is 1
    return list(roles)


# ----------------------------------------------------------------------------- verdicts


def verdict(text: str | None) -> bool | None:
    """The verdict in a judge's reply: True (accepts: "correct", "yes", ...), False (rejects:
    "incorrect", "wrong", "no", "not ...", ...), whichever word comes first; None when it has neither."""
    m = _VERDICT.search(text or "")
    if m is None:
        return None
    return m.group("accept") is not None


def accepted(state: Mapping[str, Any]) -> tuple[bool, str]:
    """A workflow ``check`` function (``fn: evolve.policy.roles:accepted``): passes when
    ``state["verdict"]`` (the judge's reply) accepts; else fails with the reply as feedback, so a
    retry step can show it (``{feedback}``)."""
    reply = str(state.get("verdict") or "")
    if verdict(reply):
        return True, ""
    return False, f"A checker rejected the answer: {reply.strip() or '(no verdict)'}"


@dataclass(frozen=True)
class VerdictTurn:
    """One judge call: where it is (``traj``, ``step`` indices), what it said, the truth of the
    answer it judged (None: unknown) and its credit (1 when the verdict matched the truth)."""

    traj: int
    step: int
    verdict: bool | None
    truth: bool | None

    @property
    def reward(self) -> float:
        return float(self.truth is not None and self.verdict is not None and self.verdict == self.truth)


def _texts(output: Any) -> list[str]:
    """The strings a rollout's final output holds (itself, or a dict's string values)."""
    if isinstance(output, str):
        return [output.strip()]
    if isinstance(output, Mapping):
        return [v.strip() for v in output.values() if isinstance(v, str)]
    return []


def verdict_turns(trajs: Sequence[Trajectory], role: str, threshold: float = 1.0) -> list[VerdictTurn]:
    """Every call of the judging ``role`` in ``trajs`` (finished rollouts only), with its verdict and
    the truth of the answer it judged: the last reply of another role before it, true when a rollout
    of the same task whose final output is that reply scored ``threshold`` or more."""
    known: dict[tuple[str, str], bool] = {}
    for t in trajs:
        if t.error is None and t.reward is not None:
            for text in _texts(t.output):
                if text:
                    known.setdefault((t.task_id, text), t.score >= threshold)
    out: list[VerdictTurn] = []
    for k, t in enumerate(trajs):
        if t.error is not None:
            continue
        judged: str | None = None
        for i, s in enumerate(t.steps):
            if not isinstance(s, LLMCall):
                continue
            if s.role != role:
                judged = s.output.strip()
                continue
            truth = known.get((t.task_id, judged)) if judged else None
            out.append(VerdictTurn(traj=k, step=i, verdict=verdict(s.output), truth=truth))
    return out


def verdict_examples(
    trajs: Sequence[Trajectory], role: str, threshold: float = 1.0, dedupe: bool = True
) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], dict[str, int]]:
    """STaR's examples of a judging role: (prompt ids, sampled ids) of its calls whose verdict
    matched the truth, and counts (``right``, ``wrong``, ``unjudged`` calls)."""
    turns = verdict_turns(trajs, role, threshold)
    out, seen = [], set()
    for v in turns:
        if v.reward <= 0:
            continue
        s = trajs[v.traj].steps[v.step]
        if not isinstance(s, LLMCall) or s.prompt_token_ids is None or not s.token_ids:
            continue
        key = (s.prompt_token_ids, s.token_ids)
        if dedupe and key in seen:
            continue
        seen.add(key)
        out.append(key)
    return out, verdict_counts(turns)


def verdict_counts(turns: Iterable[VerdictTurn]) -> dict[str, int]:
    turns = list(turns)
    return {
        "right": sum(1 for v in turns if v.reward > 0),
        "wrong": sum(1 for v in turns if v.truth is not None and v.reward <= 0),
        "unjudged": sum(1 for v in turns if v.truth is None),
    }


__all__ = [
    "VERDICT_ROLES",
    "Credit",
    "RoleParams",
    "Schedule",
    "VerdictTurn",
    "accepted",
    "check_roles",
    "default_credit",
    "trained_roles",
    "verdict",
    "verdict_examples",
    "verdict_turns",
]
