"""The ``reflective`` operator: reflective prompt mutation from trajectories and feedback (GEPA:
Agrawal et al., 2025, "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement
Learning", arXiv:2507.19457).

Each proposal, for one parent and each of ``children`` children:

1. take a minibatch of the parent's scored trajectories (``ctx.trajectories``; with ``traces``, the
   recorded gateway sessions of the training split, with their users' feedback text), failures first
   (an error, or a score below ``threshold``), each group in ``ctx.rng`` order; with
   ``skip_perfect`` a parent that failed nothing is left alone (GEPA skips perfect minibatches);
2. show the reflection LLM the current component and, per example, the input (the first user
   message of the first LLM call), the model's output, the final output when it differs, the
   reward score and the reward's ``feedback`` text (plus the error of a failed rollout);
3. ask for an improved component inside a ``` fenced block, and parse the answer strictly:
   no block, an empty block, text identical to the current one, a duplicate of an earlier
   child, or text over ``max_chars`` is rejected and recorded with the raw answer.

``component`` may be a list: child ``i`` of generation ``g`` then rewrites component
``(g + i) mod n`` (GEPA's round-robin over the modules of a compound system). The LLM is the
``model`` param (a model spec) or the parent's model ``role``. Everything asked, answered and
rejected is written to ``reflective.json`` in the work directory.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.loop.operators import OperatorContext
from evolve.prompts._common import (
    LLMSource,
    OperatorLog,
    check_new_text,
    clip,
    fenced,
    first_llm_call,
    first_user,
    show,
)
from evolve.prompts.components import get_text, parse_name, set_text
from evolve.types import Candidate, Message, System, Trajectory

TEXT_KINDS = ("instruction", "format", "template")


class ReflectiveMutation:
    name = "reflective"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        component: str | list[str] = Field(
            "instruction", description="component(s) rewritten; a list is taken round-robin by generation"
        )
        model: dict[str, Any] | None = Field(
            None,
            description="model spec {backend, name, params} of the reflection LLM; default: the parent's model `role`",
        )
        role: str = "policy"
        call_role: str | None = Field(
            None,
            description="role of the LLM call shown per example; default: the "
            "component's step, else the first call of any role",
        )
        minibatch: int = Field(4, ge=1, description="examples shown to the reflection LLM")
        children: int = Field(1, ge=1)
        threshold: float = Field(1.0, description="a trajectory scoring below this is a failure")
        traces: bool = Field(
            False,
            description="reflect on recorded gateway sessions (the training tasks of an "
            "evolve.gateway.dataset:sessions dataset: what was served, its score and its feedback "
            "text) instead of the parent's own trajectories",
        )
        skip_perfect: bool = Field(True, description="propose nothing when the minibatch has no failure")
        example_chars: int = Field(1500, ge=50, description="characters shown per input / output / feedback")
        max_chars: int = Field(4000, ge=1, description="longest component text accepted")
        temperature: float | None = 0.7
        max_tokens: int | None = 2048

        @field_validator("component")
        @classmethod
        def _text_components(cls, v: str | list[str]) -> str | list[str]:
            names = [v] if isinstance(v, str) else list(v)
            if not names:
                raise ValueError("give at least one component")
            for name in names:
                kind = parse_name(name)[1]
                if kind not in TEXT_KINDS:
                    raise ValueError(
                        f"component {name!r} has kind {kind!r}; reflective rewrites text kinds only: "
                        f"{', '.join(TEXT_KINDS)}"
                    )
            return v

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self.names = [self.p.component] if isinstance(self.p.component, str) else list(self.p.component)
        self.llms = LLMSource(self.name, self.p.model, self.p.role)

    def failed(self, t: Trajectory) -> bool:
        return t.error is not None or t.score < self.p.threshold

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal, at most: one reflection call per child."""
        return {"rollouts": 0, "llm_calls": self.p.children, "children": self.p.children}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        p = self.p
        log = OperatorLog(self.name, parent, ctx)
        try:
            if p.traces:
                from evolve.gateway.dataset import recorded_trajectories

                trajs = recorded_trajectories(list(ctx.train), p.role, parent.id, enough=p.minibatch)
            else:
                trajs = list(ctx.trajectories)
            n_fail = sum(self.failed(t) for t in trajs)
            if not trajs:
                log.note("no trajectories of the parent to reflect on; nothing proposed")
                return []
            if n_fail == 0 and p.skip_perfect:
                log.note(f"all {len(trajs)} trajectories scored >= {p.threshold}; nothing to fix (skip_perfect)")
                return []
            llm, spec = self.llms.get(parent, ctx)
            out: list[Candidate] = []
            seen: dict[str, set[str]] = {}
            for i in range(p.children):
                name = self.names[(ctx.generation + i) % len(self.names)]
                cand = self._child(i, name, parent, trajs, ctx, log, llm, seen)
                if cand is not None:
                    out.append(cand)
            log.note(f"{len(trajs)} trajectories ({n_fail} failed), {spec.backend}:{spec.name}: {log.summary()}")
            return out
        finally:
            log.write()

    def _child(
        self,
        i: int,
        name: str,
        parent: System,
        trajs: list[Trajectory],
        ctx: OperatorContext,
        log: OperatorLog,
        llm: Any,
        seen: dict[str, set[str]],
    ) -> Candidate | None:
        p = self.p
        step, kind = parse_name(name)
        current = get_text(parent, kind, step)
        failures = [t for t in trajs if self.failed(t)]
        successes = [t for t in trajs if not self.failed(t)]
        ctx.rng.shuffle(failures)
        ctx.rng.shuffle(successes)
        seed = ctx.rng.randrange(2**31)
        role = p.call_role or step
        examples: list[tuple[Trajectory, Any]] = []
        skipped: list[str] = []
        for t in failures + successes:
            if len(examples) >= p.minibatch:
                break
            call = first_llm_call(t, role) or first_llm_call(t)
            if call is None or first_user(call) is None:
                skipped.append(t.task_id)
                continue
            examples.append((t, call))
        if skipped:
            log.note(
                f"child {i}: {len(skipped)} trajectories without an LLM call and a user message skipped",
                tasks=skipped[:20],
            )
        if not examples:
            log.reject(f"child {i}: no trajectory has an LLM call with a user message to show")
            return None
        msg = self.reflection_prompt(kind, current, examples)
        raw = log.ask(
            llm,
            f"child {i}: reflect on {name}",
            [Message(role="user", content=msg)],
            seed=seed,
            temperature=p.temperature,
            max_tokens=p.max_tokens,
        )
        if raw is None:
            return None
        new, why = fenced(raw)
        why = why or check_new_text(new or "", current, p.max_chars)
        if not why and (new or "").strip() in seen.setdefault(name, set()):
            why = "duplicate of an earlier child"
        if why:
            log.reject(f"child {i}: {name}: {why}", raw=raw)
            return None
        seen[name].add((new or "").strip())
        system = set_text(parent, kind, new or "", step)
        tasks = [t.task_id for t, _ in examples]
        n_failed = sum(self.failed(t) for t, _ in examples)
        rationale = (
            f"{name} rewritten after reflecting on {len(examples)} examples ({n_failed} failed) and their feedback"
        )
        info = {"component": name, "examples": tasks, "failed": n_failed, "llm_tokens": log.tokens}
        log.child(system, rationale, **info)
        return Candidate(system=system, parents=(parent.id,), operator=self.name, rationale=rationale, info=info)

    def reflection_prompt(self, kind: str, current: str, examples: list[tuple[Trajectory, Any]]) -> str:
        """GEPA's reflection prompt: the component, then inputs, outputs, scores and feedback."""
        n = self.p.example_chars
        parts = [
            (
                f"I gave an assistant the following {kind} to perform a task:\n```\n{current}\n```\n\n"
                "Below are examples of task inputs given to the assistant, its responses, the score each "
                "response received (1 is best) and feedback on it.\n"
            )
        ]
        for k, (t, call) in enumerate(examples, 1):
            final = show(t.output) if t.output is not None else ""
            block = [
                f"### Example {k}",
                f"Input:\n{clip(first_user(call) or '', n)}",
                f"Model output:\n{clip(call.output, n)}",
            ]
            if final and final.strip() != call.output.strip():
                block.append(f"Final output:\n{clip(final, n)}")
            if t.error:
                block.append(f"Error:\n{clip(t.error, n)}")
            feedback = t.reward.feedback if t.reward is not None else ""
            block.append(f"Score: {t.score:g}")
            block.append(f"Feedback:\n{clip(feedback, n) if feedback.strip() else '(none)'}")
            parts.append("\n".join(block) + "\n")
        parts.append(
            f"Write a new {kind} for the assistant. Read the inputs carefully and infer the task and its "
            f"input format. Read every response and its feedback: work out what went wrong, and put in the "
            f"new {kind} the rules and the domain-specific facts the assistant needs, since it will not see "
            f"these examples again. Keep what already works.\n"
            f"Give the new {kind} inside a ``` fenced block."
        )
        return "\n".join(parts)
