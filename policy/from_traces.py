"""``from_traces``: SFT on what a served model answered in positively rewarded sessions, from the
gateway's trace store (tasks from :func:`evolve.gateway.dataset.sessions`), without re-running the
agent.

The targets are the exact token ids the local model sampled when it served the call, with the
prompt ids it saw, never re-tokenised text; a call is used only when it was answered by the parent's
own base weights (the same tokenizer). ``turns: final`` learns the last answered call of a session,
``all`` every call. The child is "parent base + new adapter" (continued from the parent's adapter).

A team (an app calling several model names through a gateway route with ``local: {roles: ...}``)
learns role by role: ``roles`` (one, a list, or ``all``; ``schedule`` ``joint`` or ``alternate``,
as STaR's, :mod:`evolve.policy.roles`) trains each role's adapter on the calls that role answered
(recorded as the call's ``role``), ``turns: final`` being that role's last call in the session. A
role counts a session as a success by the session's score, or, where the session's feedback has a
component named after the role (``components: {reviewer: 0}``), by that component. With the
single-role setting (``role``) the calls are sorted by role only when the sessions hold several
roles' calls, so single-role traffic trains as it always did.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.loop.operators import OperatorContext
from evolve.policy.roles import RoleParams, Schedule, trained_roles
from evolve.types import Candidate, System


class FromTraces:
    name = "from_traces"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        role: str = Field("policy", description="the model role trained when roles is not given")
        roles: str | list[str] | None = Field(
            None,
            description=("the roles trained, each on the calls it answered: one name, a list, or 'all'; null: role"),
        )
        schedule: Schedule = Field(
            "joint",
            description=(
                "joint: every listed role in each proposal; alternate: one role per generation, in the listed order"
            ),
        )
        min_score: float = Field(1.0, description="a session counts as a success at this feedback score or above")
        turns: Literal["final", "all"] = "final"
        dedupe: bool = True
        r: int = Field(16, ge=1)
        alpha: float = 32
        lr: float = Field(3e-3, gt=0)
        epochs: float = Field(3, gt=0)
        batch_size: int = Field(32, ge=1)
        min_examples: int = Field(8, ge=1, description="propose nothing with fewer examples than this")
        replay: float = Field(1.0, ge=0, description="share of the cold-start demos mixed back in")

        @model_validator(mode="after")
        def _roles(self) -> FromTraces.Params:
            self.role_params()  # the same checks as STaR's and GRPO's role settings
            return self

        def role_params(self) -> RoleParams:
            if self.roles is None:
                return RoleParams(role=self.role, schedule=self.schedule)
            if "role" in self.model_fields_set:
                raise ValueError("give roles (one, a list, or all) or role, not both")
            return RoleParams(roles=self.roles, schedule=self.schedule)

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    @classmethod
    def check_models(cls, params: dict, models: Any) -> None:
        """Load-time check of ``roles`` against the task file's models (a ConfigError naming them)."""
        from evolve.policy.roles import check_roles

        check_roles(cls.Params(**params).role_params(), models)

    def estimate(self, plan: Any) -> dict[str, int]:
        return {"rollouts": 0, "llm_calls": 0, "children": 1}

    def examples(
        self, tasks: list[dict], base: str, role: str | None = None
    ) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], dict]:
        """(prompt ids, sampled ids) of the calls to learn from ``tasks`` answered by ``base``, and
        counts. ``role``: only that role's calls, the session scored by its component ``role`` when
        it has one (with the single-role setting, only when the sessions hold several roles)."""
        out, seen = [], set()
        counts = {"sessions": 0, "successes": 0, "other_base": 0, "no_tokens": 0}
        by_role = role is not None and (
            self.p.roles is not None or len({c.get("role") for t in tasks for c in t.get("calls") or []} - {None}) > 1
        )
        if by_role:
            counts["other_role"] = 0
        for t in tasks:
            counts["sessions"] += 1
            calls = [c for c in t.get("calls") or [] if c.get("status", "ok") == "ok"]
            score = t.get("score")
            if by_role:
                mine = [c for c in calls if c.get("role") == role]
                counts["other_role"] += len(calls) - len(mine)
                calls = mine
                score = (t.get("components") or {}).get(role, score) if self.p.roles is not None else score
            if score is None or score < self.p.min_score:
                continue
            counts["successes"] += 1
            for c in calls[-1:] if self.p.turns == "final" else calls:
                if not c.get("prompt_token_ids") or not c.get("token_ids"):
                    counts["no_tokens"] += 1
                    continue
                if c.get("base") != base:
                    counts["other_base"] += 1
                    continue
                key = (tuple(c["prompt_token_ids"]), tuple(c["token_ids"]))
                if self.p.dedupe and key in seen:
                    continue
                seen.add(key)
                out.append(key)
        return out, counts

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        from evolve.policy.sft import trainable_spec

        p = self.p
        specs = {
            r: trainable_spec(parent, r, ctx.log, self.name)
            for r in trained_roles(p.role_params(), parent.models, getattr(ctx, "generation", 0))
        }
        specs = {r: s for r, s in specs.items() if s is not None}
        if not specs:
            return []
        tasks = list(ctx.train)
        per_role, counts = {}, {}
        for role, spec in specs.items():
            examples, counts[role] = self.examples(tasks, spec.base.sha256, role)
            c = counts[role]
            who = "" if p.roles is None else f"{role}: "
            mixed = f", {c['other_role']} answered by other roles" if "other_role" in c else ""
            ctx.log(
                f"from_traces: {who}{c['successes']}/{c['sessions']} sessions scored >= {p.min_score:g}; "
                f"{len(examples)} recorded turns to learn ({c['other_base']} answered by another base, "
                f"{c['no_tokens']} without token ids{mixed})"
            )
            if len(examples) >= p.min_examples:
                per_role[role] = examples
        if not per_role:
            return []
        from evolve.policy.star import train_roles

        child, stats, n_all = train_roles(parent, specs, per_role, ctx, p)
        by_role = {
            r: {
                **counts[r],
                "examples": len(ex),
                "replayed": n_all[r] - len(ex),
                "train_loss": stats[r].get("loss"),
                "curve": stats[r].get("curve"),
            }
            for r, ex in per_role.items()
        }
        info: dict[str, Any] = next(iter(by_role.values())) if p.roles is None else {"roles": by_role}
        why = "; ".join(
            f"{'' if p.roles is None else r + ': '}LoRA r={p.r} trained on {len(ex)} recorded turns of "
            f"{counts[r]['successes']} sessions scored >= {p.min_score:g} + {n_all[r] - len(ex)} replayed demos"
            for r, ex in per_role.items()
        )
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=info)]
