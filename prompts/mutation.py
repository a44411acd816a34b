"""The ``prompt_mutation`` operator: LLM mutation of a prompt component with evolving mutation
prompts (PromptBreeder: Fernando et al., 2023, "Promptbreeder: Self-Referential
Self-Improvement via Prompt Evolution", arXiv:2309.16797).

Each proposal, for one parent and each of ``children`` children:

* **direct (first-order) mutation** — an LLM rewrites the target component (``component``,
  default ``instruction``) given a *mutation prompt* ("Rewrite the instruction so that...")
  and a *thinking style* ("Let's think step by step.");
* **hyper-mutation** — with probability ``hyper_rate`` the LLM first improves the mutation
  prompt itself (PromptBreeder's first-order hyper-mutation); the improved one replaces the old
  in the child's ``mutator`` component and is then applied. The mutation prompts live in the
  system (component ``<step>.mutator``, JSON list), so they are selected along with the prompts
  they produced, archived, and restored on resume; a parent without one is seeded from
  :data:`MUTATION_PROMPTS` (or the ``mutation_prompts`` param) and its children carry the seeds;
* **zero-order generation** — with probability ``zero_order_rate``, or always when the
  component is empty, a new component is generated from the task description alone
  (``task_description``, default the parent's ``<step>.task`` component).

The LLM is the operator's ``model`` (a model spec) or, when absent, the parent's model
``role``. Every question, answer and rejection (empty, identical, duplicate, too long, model
error) is written to ``prompt_mutation.json`` in the work directory. Randomness comes only
from ``ctx.rng``; the seed of each model call is drawn from it too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evolve.loop.operators import OperatorContext
from evolve.prompts._common import LLMSource, OperatorLog, check_new_text, loose_answer
from evolve.prompts.components import get_mutators, get_task, get_text, parse_name, set_mutators, set_text
from evolve.types import Candidate, Message, System

THINKING_STYLES = (
    "Let's think step by step.",
    "Let's make a step-by-step plan and follow it, with clear notation.",
    "How could I simplify the problem so that it is easier to solve?",
    "What are the key assumptions underlying this problem?",
    "What mistakes are easy to make here, and how can they be avoided?",
    "Let's look at the problem from a different perspective.",
    "How would an expert in this field approach it?",
    "Question the assumptions and check the evidence.",
    "Let's work backwards from the desired result.",
    "Is there a simpler, more direct way to say this?",
)

MUTATION_PROMPTS = (
    "Rewrite the instruction so that it is clearer and more specific.",
    "Modify the instruction creatively, adding advice on how to solve the task.",
    "Make a variant of the instruction that a careful expert would give.",
    "Shorten the instruction, keeping every rule that matters.",
    "Change the instruction so that it warns about the most likely mistakes.",
    "Rewrite the instruction as a short checklist for the assistant to follow.",
    "Generate a mutated version of the instruction with an unexpected but useful twist.",
    "Add one concrete tip to the instruction that would make the answers more accurate.",
)

HYPER_PROMPTS = (
    "Please summarize and improve the following mutation prompt.",
    "Rewrite this mutation prompt so that it produces more useful and more varied instructions.",
    "Simplify this mutation prompt into one clear sentence that keeps its intent.",
    "Make this mutation prompt more specific about what a better instruction looks like.",
)

TEXT_KINDS = ("instruction", "format", "template")
_ANSWER = "Answer with the new {what} alone, inside a ``` fenced block."


class PromptMutation:
    name = "prompt_mutation"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        component: str = Field("instruction", description="the component rewritten: '<step>.<kind>' or '<kind>'")
        model: dict[str, Any] | None = Field(
            None,
            description="model spec {backend, name, params} of the mutating LLM; default: the parent's model `role`",
        )
        role: str = "policy"
        children: int = Field(1, ge=1)
        hyper_rate: float = Field(0.2, ge=0, le=1, description="chance of improving the mutation prompt first")
        zero_order_rate: float = Field(0.1, ge=0, le=1, description="chance of generating from the task alone")
        task_description: str | None = Field(None, description="default: the parent's '<step>.task' component")
        mutation_prompts: list[str] | None = Field(None, description="seeds when the parent carries none")
        thinking_styles: list[str] | None = None
        hyper_prompts: list[str] | None = None
        temperature: float | None = 0.8
        max_tokens: int | None = 1024
        max_chars: int = Field(4000, ge=1, description="longest text accepted")

        @field_validator("component")
        @classmethod
        def _text_component(cls, v: str) -> str:
            kind = parse_name(v)[1]
            if kind not in TEXT_KINDS:
                raise ValueError(
                    f"component {v!r} has kind {kind!r}; prompt_mutation rewrites text kinds only: "
                    f"{', '.join(TEXT_KINDS)}"
                )
            return v

        @field_validator("mutation_prompts", "thinking_styles", "hyper_prompts")
        @classmethod
        def _non_empty(cls, v: list[str] | None) -> list[str] | None:
            if v is not None and (not v or not all(isinstance(s, str) and s.strip() for s in v)):
                raise ValueError("give a non-empty list of non-empty strings, or leave it out for the built-in list")
            return v

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self.step, self.kind = parse_name(self.p.component)
        self.llms = LLMSource(self.name, self.p.model, self.p.role)

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal, at most (``evolve run --dry-run``): a mutation call per child, plus a
        hyper-mutation call for each child that draws one (counted as if every child did)."""
        calls = self.p.children * (2 if self.p.hyper_rate > 0 else 1)
        return {"rollouts": 0, "llm_calls": calls, "children": self.p.children}

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        p, step, kind = self.p, self.step, self.kind
        log = OperatorLog(self.name, parent, ctx)
        try:
            llm, spec = self.llms.get(parent, ctx)
            current = get_text(parent, kind, step)
            stored = get_mutators(parent, step)
            mutators = list(stored) if stored else list(p.mutation_prompts or MUTATION_PROMPTS)
            if not stored:
                log.note(f"the parent carries no mutation prompts for step {step!r}; seeded {len(mutators)}")
            description = p.task_description if p.task_description is not None else get_task(parent, step)
            out: list[Candidate] = []
            seen = {current.strip()}
            for i in range(p.children):
                cand = self._child(i, parent, ctx, log, llm, current, mutators, description, seen)
                if cand is not None:
                    out.append(cand)
                    seen.add(get_text(cand.system, kind, step).strip())
            log.note(f"{p.component} of {parent.id[:8]} with {spec.backend}:{spec.name}: {log.summary()}")
            return out
        finally:
            log.write()

    def _child(
        self,
        i: int,
        parent: System,
        ctx: OperatorContext,
        log: OperatorLog,
        llm: Any,
        current: str,
        mutators: list[str],
        description: str,
        seen: set[str],
    ) -> Candidate | None:
        p, step, kind = self.p, self.step, self.kind
        rng = ctx.rng
        # every draw is made up front, so the random stream does not depend on the model's answers
        r_zero, r_hyper = rng.random(), rng.random()
        j = rng.randrange(len(mutators))
        style = rng.choice(list(p.thinking_styles or THINKING_STYLES))
        hyper_prompt = rng.choice(list(p.hyper_prompts or HYPER_PROMPTS))
        seed_hyper, seed_main = rng.randrange(2**31), rng.randrange(2**31)
        ask = {"temperature": p.temperature, "max_tokens": p.max_tokens}
        zero = not current.strip() or r_zero < p.zero_order_rate
        if zero and current.strip() and not description.strip():
            log.note(f"child {i}: zero-order drawn but there is no task description; mutating instead")
            zero = False
        child_mutators = list(mutators)
        hyper: dict[str, str] | None = None
        if zero:
            mode, mutation_prompt = "zero_order", None
            msg = self._zero_order_prompt(description)
        else:
            mode, mutation_prompt = "first_order", mutators[j]
            if r_hyper < p.hyper_rate:
                raw = log.ask(
                    llm,
                    f"child {i}: hyper-mutation",
                    [Message(role="user", content=self._hyper_prompt(hyper_prompt, mutators[j]))],
                    seed=seed_hyper,
                    **ask,
                )
                if raw is not None:
                    new, why = loose_answer(raw)
                    why = why or check_new_text(new or "", mutators[j], p.max_chars)
                    if not why and new in mutators:
                        why = "the new mutation prompt is already in the list"
                    if why:
                        log.reject(f"child {i}: hyper-mutation: {why}", raw=raw, mutation_prompt=mutators[j])
                    else:
                        hyper = {"old": mutators[j], "new": new or ""}
                        child_mutators[j] = mutation_prompt = new or ""
            msg = self._mutation_prompt(mutation_prompt or "", style, current, description)
        raw = log.ask(llm, f"child {i}: {mode}", [Message(role="user", content=msg)], seed=seed_main, **ask)
        if raw is None:
            return None
        new, why = loose_answer(raw)
        why = why or check_new_text(new or "", current, p.max_chars)
        if not why and (new or "").strip() in seen:
            why = "duplicate of an earlier child"
        if why:
            log.reject(f"child {i}: {mode}: {why}", raw=raw)
            return None
        system = set_mutators(set_text(parent, kind, new or "", step), child_mutators, step)
        what = "generated from the task description" if zero else f"mutated by {mutation_prompt!r}"
        rationale = f"{p.component} {what}" + (f"; mutation prompt improved from {hyper['old']!r}" if hyper else "")
        info = {
            "mode": mode,
            "mutation_prompt": mutation_prompt,
            "thinking_style": None if zero else style,
            "hyper": hyper,
            "llm_tokens": log.tokens,
        }
        log.child(system, rationale, **info)
        return Candidate(system=system, parents=(parent.id,), operator=self.name, rationale=rationale, info=info)

    # ------------------------------------------------------------------ what the LLM is asked

    def _zero_order_prompt(self, description: str) -> str:
        task = description.strip() or "(no task description was given)"
        return (
            f"Task description:\n{task}\n\nWrite the {self.kind} an assistant should be given to perform this "
            f"task well.\n" + _ANSWER.format(what=self.kind)
        )

    def _mutation_prompt(self, mutation_prompt: str, style: str, current: str, description: str) -> str:
        task = f"The task: {description.strip()}\n\n" if description.strip() else ""
        return (
            f"{mutation_prompt}\nThinking style: {style}\n\n{task}Current {self.kind}:\n```\n{current}\n```\n\n"
            + _ANSWER.format(what=self.kind)
        )

    def _hyper_prompt(self, hyper_prompt: str, mutation_prompt: str) -> str:
        return (
            f"{hyper_prompt}\n\nA mutation prompt is given to a language model together with an assistant's "
            f"{self.kind}, to rewrite that {self.kind} into a better one.\nMutation prompt:\n```\n"
            f"{mutation_prompt}\n```\n\n" + _ANSWER.format(what="mutation prompt")
        )
