"""The ``toolforge`` operator: grow and prune the system's tool library from its trajectories.

Each proposal, for one parent:

1. counts how often each library tool was used in the parent's trajectories, and in how many
   successful ones; retires tools that stay unused or that lower success;
2. proposes new tools — by abstraction of repeated actions (``miner``, no LLM: the world's
   ``tools.mine`` hook, e.g. the SQL world's repeated SQL shapes) and/or by an LLM
   shown recorded tool calls (``synthesis``: a model spec, e.g. ``{backend: litellm, name:
   gpt-4o-mini}``);
3. drops duplicates (same code, same template, or same results on shared inputs);
4. runs each remaining tool in the sandbox against its tests and the recorded outputs it claims
   to reproduce, and admits only those that pass;
5. proposes the parent with the new library (when it changed).

With ``traces: true`` the trajectories are recorded gateway sessions instead of rollouts: each tool
call the agent's model asked for, with the result the agent sent back in a later call
(:func:`evolve.gateway.dataset.tool_steps`); a route with ``evolve.tools`` then serves the admitted
tools, run by the gateway in the sandbox. Every verdict — admitted,
   rejected and why, the raw text of a malformed LLM answer — is written to
   ``toolforge.json`` in the operator's work directory and summarised in the candidate's info.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.loop.operators import ChargedLLM, OperatorContext
from evolve.toolforge.curate import duplicate_of, retirements, with_usage
from evolve.toolforge.synth import synthesize
from evolve.toolforge.tool import Tool, ToolLibrary
from evolve.toolforge.validate import check, default_sandbox, make_limits
from evolve.types import Candidate, ModelSpec, System


class ToolForge:
    name = "toolforge"
    world_params = {"miner": "tools.mine"}  # filled from the task's world when not given

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)
        abstraction: bool = Field(True, description="mine repeated actions into parametrised tools (with miner)")
        miner: str | None = Field(
            None,
            description="import path of miner(trajectories, *, tool, sql_arg, db_arg, "
            "min_support, taken, provenance) -> tools (the world's tools.mine hook)",
        )
        source_tool: str | None = Field(
            None,
            description="the recorded tool whose calls are mined (default: the "
            "miner's own: execute_sql in the SQL world, shell in the harbor world)",
        )
        sql_arg: str = "sql"
        db_arg: str = "db"
        min_support: int = Field(3, ge=1, description="distinct successful tasks a shape needs")
        synthesis: dict[str, Any] | None = Field(None, description="model spec of the tool-writing LLM, or none")
        proposals: int = Field(2, ge=0, description="LLM answers asked per proposal")
        examples: int = Field(8, ge=1, description="recorded tool calls shown to the LLM")
        temperature: float | None = 0.7
        tasks: int = Field(0, ge=0, description="extra training tasks rolled out to mine from (0: the minibatch only)")
        traces: bool = Field(
            False,
            description="mine the tool calls recorded in gateway sessions (the training tasks "
            "of an evolve.gateway.dataset:sessions dataset) instead of the parent's rollouts",
        )
        samples: int = Field(1, ge=1)
        threshold: float = Field(1.0, description="a trajectory counts as a success at this score or above")
        max_new: int = Field(10, ge=0, description="tools admitted per proposal at most")
        max_tools: int = Field(40, ge=1, description="library size cap")
        retire: bool = True
        patience: int = Field(2, ge=1, description="generations a tool may stay unused")
        min_uses: int = Field(10, ge=1)
        margin: float = Field(0.1, ge=0)
        sandbox: str = Field("process", description="sandbox backend: process | docker")
        limits: dict[str, Any] = Field(default_factory=dict, description="sandbox limits per tool call")

        @model_validator(mode="after")
        def _abstraction_needs_a_miner(self) -> ToolForge.Params:
            if self.abstraction and self.miner is None:
                raise ValueError(
                    "abstraction needs a miner: give params.miner (an import path), a world that "
                    "provides tools.mine (world: sql), or set abstraction: false"
                )
            return self

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self._sandbox: Any = None
        self._llm: Any = None

    @property
    def sandbox(self) -> Any:
        if self._sandbox is None:
            self._sandbox = default_sandbox(self.p.sandbox)
        return self._sandbox

    def _synth_llm(self, ctx: OperatorContext) -> Any:
        if self._llm is None and self.p.synthesis is not None:
            from evolve.llm.cache import build_llm

            self._llm = build_llm(ModelSpec.model_validate(self.p.synthesis), ctx.artifacts)
        return self._llm

    def estimate(self, plan: Any) -> dict[str, int]:
        """Per proposal (for ``evolve run --dry-run``): ``tasks`` x ``samples`` extra rollouts to mine
        from, and ``proposals`` calls of the synthesis model when there is one."""
        p = self.p
        return {
            "rollouts": min(p.tasks, plan.train) * p.samples,
            "llm_calls": p.proposals if p.synthesis is not None else 0,
            "children": 1,
        }

    def propose(self, parent: System, ctx: OperatorContext) -> list[Candidate]:
        p = self.p
        lib = ToolLibrary.from_system(parent)
        if p.traces:  # what the agent's own tools did in live traffic, each call with what came back
            from evolve.gateway.dataset import recorded_trajectories

            trajs = recorded_trajectories(list(ctx.train))
        else:
            trajs = list(ctx.trajectories)
        if p.tasks and not p.traces:
            tasks = ctx.rng.sample(list(ctx.train), min(p.tasks, len(ctx.train)))
            trajs += ctx.rollouts(
                parent, tasks, samples=p.samples, temperature=p.temperature, tag="toolforge", logprobs=False
            )  # scores and text only
        lib = with_usage(lib, trajs, threshold=p.threshold)
        report: dict[str, Any] = {"admitted": [], "rejected": [], "duplicates": [], "retired": []}
        if p.retire:
            for r in retirements(
                lib,
                trajs,
                generation=ctx.generation,
                patience=p.patience,
                min_uses=p.min_uses,
                margin=p.margin,
                threshold=p.threshold,
            ):
                report["retired"].append({"tool": r.name, "reason": r.reason})
                lib = ToolLibrary({n: t for n, t in lib.tools.items() if n != r.name})
        prov = {"operator": self.name, "generation": ctx.generation, "parent_system": parent.id}
        proposals: list[tuple[Tool, list[Any]]] = []  # (tool, claimed recorded cases)
        if p.abstraction:
            from evolve.registry import import_path

            mine = import_path(str(p.miner), what="toolforge miner")
            source = {"tool": p.source_tool} if p.source_tool else {}
            for tool in mine(
                trajs,
                **source,
                sql_arg=p.sql_arg,
                db_arg=p.db_arg,
                min_support=p.min_support,
                taken=lib.names(),
                provenance=prov,
            ):
                proposals.append((tool, []))
        llm = self._synth_llm(ctx)
        if llm is not None and p.proposals:
            llm = ChargedLLM(llm, ctx)  # its calls count against the run's budget
            for prop in synthesize(
                llm,
                trajs,
                lib,
                n=p.proposals,
                examples=p.examples,
                threshold=p.threshold,
                rng=ctx.rng,
                temperature=p.temperature,
                provenance=prov,
            ):
                if prop.tool is None:
                    report["rejected"].append({"tool": None, "reason": prop.error, "raw": prop.raw[:2000]})
                else:
                    proposals.append((prop.tool, prop.claims))
        limits = make_limits(**p.limits)
        added = 0
        for tool, claims in proposals:
            if added >= p.max_new or len(lib) >= p.max_tools:
                break
            if tool.name in lib:
                tool = tool.model_copy(update={"name": lib.unique_name(tool.name)})
            dup = duplicate_of(tool, lib, self.sandbox, limits=limits)
            if dup is not None:
                report["duplicates"].append({"tool": tool.name, "of": dup[0], "reason": dup[1]})
                continue
            min_recorded = 1 if tool.origin == "llm" else len(tool.tests)
            verdict = check(tool, self.sandbox, claims, min_recorded=min_recorded, limits=limits)
            entry = {
                "tool": tool.name,
                "signature": tool.signature,
                "origin": tool.origin,
                "passed": verdict.passed,
                "total": verdict.total,
                "failures": verdict.failures[:5],
            }
            if verdict.admitted:
                tests = tuple(tool.tests) + tuple(claims)
                lib = ToolLibrary({**lib.tools, tool.name: tool.model_copy(update={"tests": tests})})
                report["admitted"].append(entry)
                added += 1
            else:
                report["rejected"].append({**entry, "reason": verdict.summary()})
        (ctx.workdir / "toolforge.json").write_text(json.dumps(report, indent=1, default=str))
        for kind in ("admitted", "rejected", "duplicates", "retired"):
            ctx.log(
                f"toolforge: {len(report[kind])} {kind}"
                + (": " + ", ".join(str(e.get("tool")) for e in report[kind][:8]) if report[kind] else "")
            )
        if not report["admitted"] and not report["retired"]:
            return []
        child = lib.apply_to(parent)
        info = {k: len(v) for k, v in report.items()} | {"library": len(lib)}
        why = (
            f"tools: +{len(report['admitted'])} admitted ({', '.join(e['tool'] for e in report['admitted'][:5])}), "
            f"-{len(report['retired'])} retired, {len(report['rejected'])} rejected; library of {len(lib)}"
        )
        return [Candidate(system=child, parents=(parent.id,), operator=self.name, rationale=why, info=info)]
