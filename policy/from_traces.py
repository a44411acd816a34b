"""``from_traces``: SFT on what a served model answered in positively rewarded sessions, from the
gateway's trace store (tasks from :func:`evolve.gateway.dataset.sessions`), without re-running the
agent.

The targets are the exact token ids the local model sampled when it served the call, with the
prompt ids it saw, never re-tokenised text; a call is used only when it was answered by the parent's
own base weights (the same tokenizer). ``turns: final`` learns the last answered call of a session,
``all`` every call. The child is "parent base + new adapter" (continued from the parent's adapter).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evolve.loop.operators import OperatorContext
from evolve.types import Candidate, System


class FromTraces:
    name = "from_traces"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        role: str = "policy"
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

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)

    def estimate(self, plan: Any) -> dict[str, int]:
        return {"rollouts": 0, "llm_calls": 0, "children": 1}

    def examples(self, tasks: list[dict], base: str) -> tuple[list[tuple[tuple[int, ...], tuple[int, ...]]], dict]:
        out, seen = [], set()
        counts = {"sessions": 0, "successes": 0, "other_base": 0, "no_tokens": 0}
        for t in tasks:
            counts["sessions"] += 1
            if t.get("score") is None or t["score"] < self.p.min_score:
                continue
            counts["successes"] += 1
            calls = [c for c in t.get("calls") or [] if c.get("status", "ok") == "ok"]
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
        spec = trainable_spec(parent, p.role, ctx.log, self.name)
        if spec is None:
            return []
        examples, counts = self.examples(list(ctx.train), spec.base.sha256)
        ctx.log(f"from_traces: {counts['successes']}/{counts['sessions']} sessions scored >= {p.min_score:g}; "
                f"{len(examples)} recorded turns to learn ({counts['other_base']} answered by another base, "
                f"{counts['no_tokens']} without token ids)")
        if len(examples) < p.min_examples:
            return []
        from evolve.policy.star import train_adapter_child

        n_own = len(examples)
        child, stats, n_all = train_adapter_child(parent, spec, p.role, examples, ctx, r=p.r, alpha=p.alpha, lr=p.lr,
                                                  epochs=p.epochs, batch_size=p.batch_size, replay=p.replay)
        info = {**counts, "examples": n_own, "replayed": n_all - n_own, "train_loss": stats.get("loss"),
                "curve": stats.get("curve")}
        why = (f"LoRA r={p.r} trained on {n_own} recorded turns of {counts['successes']} sessions scored "
               f">= {p.min_score:g} + {n_all - n_own} replayed demos")
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=info)]
