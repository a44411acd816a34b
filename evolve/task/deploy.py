"""The task file's ``deploy:`` section: how a candidate the engine found becomes the system users
are served (gates, canary, approval). Without it a run promotes its best system as before."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Suite(_Strict):
    """A named task set scored by a pinned reward."""

    name: str = Field(description="what the suite guards, e.g. regression, refusals, format")
    tasks: str = Field(
        "val",
        description="a split of the task's dataset (train, val, test, or gate: tasks held out "
        "from the run's selection) or a JSONL file of tasks (relative to the task "
        "file)",
    )
    reward: str | None = Field(None, description="import path of the suite's reward (default: the task's reward)")
    limit: int | None = Field(None, ge=1, description="use the first N tasks only")


class Regression(Suite):
    name: str = "regression"
    tasks: str = Field(
        "gate",
        description="the gate split (held out from selection, deploy.gate_share of val), "
        "another split, or a JSONL file of tasks (relative to the task file)",
    )
    risk: float = Field(
        0.05, gt=0, lt=0.5, description="the chance the gate passes a candidate that is worse by more than the margin"
    )
    margin: float = Field(
        0.0, ge=0, description="how much worse than the active system (in score points, 0-1) is tolerated"
    )
    min_tasks: int = Field(30, ge=2, description="a gate decided on fewer tasks fails")


class Guard(Suite):
    floor: float | None = Field(None, description="the candidate's mean score on the suite must be at least this")
    max_p95_seconds: float | None = Field(None, gt=0, description="ceiling on the 95th percentile of rollout time")
    max_cost: float | None = Field(None, ge=0, description="ceiling on the mean cost of a rollout (USD)")
    max_tokens: float | None = Field(None, ge=0, description="ceiling on the mean tokens of a rollout")

    @model_validator(mode="after")
    def _something(self) -> Guard:
        if self.floor is None and self.max_p95_seconds is None and self.max_cost is None and self.max_tokens is None:
            raise ValueError(
                f"guard {self.name!r} sets no floor and no ceiling; give floor, max_p95_seconds, max_cost or max_tokens"
            )
        return self


class Canary(_Strict):
    share: float = Field(0.1, gt=0, lt=1, description="the share of new sessions the candidate serves")
    alpha: float = Field(
        0.05, gt=0, lt=0.5, description="error rate of the sequential test, valid however often it is checked"
    )
    margin: float = Field(
        0.02, ge=0, description="promote once the candidate is surely no worse than this below the active system"
    )
    min_sessions: int = Field(50, ge=1, description="scored candidate sessions before it may be promoted")
    max_sessions: int = Field(
        2000,
        ge=1,
        description="scored candidate sessions after which an undecided canary stops (the candidate is not promoted)",
    )
    max_hours: float = Field(72, gt=0, description="hours after which an undecided canary stops")


class DeployConfig(_Strict):
    """What a candidate must pass before it serves users. With this section the engine proposes
    its best system instead of making it current; ``evolve promote`` drives the rest."""

    regression: Regression | None = Field(Regression(), description="the paired no-worse-than-active gate (null: none)")
    guards: list[Guard] = Field(
        default_factory=list, description="suites that must keep a floor or a ceiling whatever the average does"
    )
    canary: Canary | None = Field(None, description="serve a share of live sessions through evolve gateway first")
    approval: bool = Field(
        False, description="a person's evolve promote --approve is needed after the gates and canary"
    )
    gate_share: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="the share of the val split held out from the run's "
        "selection as the gate split (chosen by the seed when "
        "the run starts)",
    )
    data_files: list[str] = Field(
        default_factory=list,
        description="files the reward or agent reads (relative to the task file), pinned by content with the code",
    )
    answer_fields: list[str] | None = Field(
        None,
        description="task fields holding the expected answer, refused in "
        "a candidate's text (default: fields named like gold, "
        "answer, expected, solution, label, target, reference)",
    )
    on_change: Literal["refuse"] = Field(
        "refuse", description="a reward or suite whose code changed since it was pinned is refused until re-pinned"
    )

    @model_validator(mode="after")
    def _names(self) -> DeployConfig:
        names = [g.name for g in self.guards] + ([self.regression.name] if self.regression else [])
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"suite names must differ; {dup} is used twice")
        return self


__all__ = ["Canary", "DeployConfig", "Guard", "Regression", "Suite"]
