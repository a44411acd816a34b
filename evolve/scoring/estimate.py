"""The dry run: what a configured run will spend, before it spends anything.

:func:`estimate_run` reads the task file's plan (dataset sizes, generations, parents,
minibatch, operators, budgets) and counts, phase by phase, the rollouts the engine would run
and the LLM calls, tokens and money they would cost. It builds no model, runs no rollout,
trains nothing and writes nothing (only the dataset source is called, to know the splits).

The count is the plan's **maximum** (what the engine does when every child passes stage 1):

* baseline: ``val`` rollouts (``engine.val_size`` or the whole val split);
* generation g: ``parents_g = min(engine.parents, 1 + children so far)`` parents, each rolled
  out on the minibatch; each operator's own rollouts and LLM calls; each child on the
  minibatch (stage 1) and on val (stage 2). A child that fails stage 1 skips val, and a
  parent or child rolled out on a task before is memoised, so a real run may spend less;
  with ``engine.reeval``, at most ``samples × val`` more per child twice (vs its parent, vs the
  best) and per parent once;
* after the loop, outside every budget: the baseline and the promoted system on test.

Operators declare their cost with an optional method ``estimate(plan: RunPlan) -> {"rollouts":
int, "llm_calls": int, "children": int}`` (per call of ``propose``; ``llm_calls`` are calls made
outside rollouts, e.g. a reflection prompt). Without it an operator counts as ``children``
(its param, else 1) children and "unknown" own cost.

LLM calls per rollout: ``budget.calls_per_rollout`` when set, else 1 (the output says which).
Tokens per call are an estimate: the prompt components' characters / 4 plus the model's
``max_tokens`` (256 when unset). Money per call: litellm's local price map for ``litellm``
models, ``cost_per_call`` for ``scripted`` ones, 0 for local models. Budgets on rollouts,
calls, tokens and money cap the plan where the run would stop; wall time is not estimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.task.config import TaskConfig

DEFAULT_COMPLETION_TOKENS = 256


@dataclass(frozen=True)
class RunPlan:
    """What an operator's ``estimate`` sees."""

    minibatch: int  # training tasks per generation (after clipping to the train split)
    train: int  # training tasks in all
    val: int  # validation tasks used
    generations: int
    parents: int  # engine.parents (the most parents a generation can have)
    calls_per_rollout: float


def _operator_costs(task: TaskConfig, plan: RunPlan) -> list[dict[str, Any]]:
    from evolve.registry import operators as operator_registry

    out = []
    for cfg in task.operators:
        op = operator_registry.get(cfg.name)(**cfg.params)
        est = getattr(op, "estimate", None)
        if callable(est):
            e = dict(est(plan))
            out.append(
                {
                    "name": cfg.name,
                    "declared": True,
                    "rollouts": int(e.get("rollouts", 0)),
                    "llm_calls": int(e.get("llm_calls", 0)),
                    "children": int(e.get("children", 1)),
                }
            )
        else:
            children = cfg.params.get("children", getattr(getattr(op, "p", None), "children", 1))
            out.append(
                {
                    "name": cfg.name,
                    "declared": False,
                    "rollouts": 0,
                    "llm_calls": 0,
                    "children": int(children if isinstance(children, int) else 1),
                }
            )
    return out


def _pricing(task: TaskConfig) -> dict[str, Any]:
    """Tokens and money per LLM call for the run's main role (``policy`` when it has one)."""
    role = "policy" if "policy" in task.models else next(iter(task.models))
    m = task.models[role]
    prompt = math.ceil(sum(len(v) for v in task.prompts.values()) / 4)
    max_tokens = m.params.get("max_tokens")
    completion = int(max_tokens) if isinstance(max_tokens, int) else DEFAULT_COMPLETION_TOKENS
    out: dict[str, Any] = {
        "role": role,
        "backend": m.backend,
        "model": m.name,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_note": "estimate: prompt = characters of the prompt components / 4 (task inputs "
        "and earlier turns not counted), completion = "
        + ("max_tokens" if isinstance(max_tokens, int) else f"{DEFAULT_COMPLETION_TOKENS} (max_tokens unset)"),
    }
    if m.backend == "litellm":
        from evolve.llm.litellm import import_litellm

        costs = import_litellm().model_cost
        entry = costs.get(m.name) or costs.get(m.name.split("/", 1)[-1])
        if entry and "input_cost_per_token" in entry:
            usd = prompt * float(entry["input_cost_per_token"]) + completion * float(
                entry.get("output_cost_per_token", 0)
            )
            out.update(usd_per_call=usd, price="litellm's local cost map")
        else:
            out.update(usd_per_call=None, price=f"unknown: {m.name!r} is not in litellm's local cost map")
    elif m.backend == "scripted":
        out.update(usd_per_call=float(m.params.get("cost_per_call") or 0.0), price="scripted cost_per_call")
    else:
        out.update(usd_per_call=0.0, price=f"{m.backend} model: no money")
    return out


def _row(phase: str, rollouts: int, cpr: float, op_calls: int, price: dict[str, Any], **extra: Any) -> dict[str, Any]:
    calls = math.ceil(rollouts * cpr - 1e-9)
    per_call = price["prompt_tokens"] + price["completion_tokens"]
    usd = price["usd_per_call"]
    return {
        "phase": phase,
        "rollouts": rollouts,
        "calls": calls,
        "op_calls": op_calls,
        "tokens": (calls + op_calls) * per_call,
        "usd": None if usd is None else (calls + op_calls) * usd,
        **extra,
    }


def _total(rows: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    usd = [r["usd"] for r in rows]
    return {
        "phase": phase,
        **{k: sum(r[k] for r in rows) for k in ("rollouts", "calls", "op_calls", "tokens")},
        "usd": None if any(u is None for u in usd) else sum(usd),
    }


def _stop(task: TaskConfig, rows: list[dict[str, Any]], cpr: float, price: dict[str, Any]) -> dict[str, Any] | None:
    """Where the first budget would stop the run. Each budget is spent by rollouts (``cpr`` calls
    each) and by operators' own LLM calls, which are taken to come first within their phase (an
    operator asks its model before its children are judged)."""
    b = task.budget
    ptok = price["prompt_tokens"] + price["completion_tokens"]
    usd = price["usd_per_call"] or 0.0
    # kind -> (limit, cost of one rollout, cost of one operator call, whole batches run past the limit?)
    limits: dict[str, tuple[float, float, float, bool, str]] = {}
    if b.rollouts is not None:
        limits["rollouts"] = (b.rollouts, 1.0, 0.0, False, f"budget.rollouts = {b.rollouts}")
    if b.calls is not None:
        limits["calls"] = (b.calls, cpr, 1.0, False, f"budget.calls = {b.calls}")
    if b.tokens is not None and ptok:
        limits["tokens"] = (b.tokens, cpr * ptok, ptok, True, f"budget.tokens = {b.tokens}")
    if b.usd is not None and usd:
        limits["usd"] = (b.usd, cpr * usd, usd, True, f"budget.usd = {b.usd:g}")
    best: dict[str, Any] | None = None
    for kind, (limit, per_rollout, per_op, whole, text) in limits.items():
        used, seen = 0.0, 0
        for r in rows:
            used += r.get("op_calls", 0) * per_op
            room = (limit - used) / per_rollout
            fit = max(0, math.ceil(room - 1e-9) if whole else math.floor(room + 1e-9))
            if fit < r["rollouts"]:
                n = seen + fit
                if best is None or n < best["rollouts"]:
                    best = {
                        "budget": kind,
                        "limit": text,
                        "phase": r["phase"],
                        "rollouts": n,
                        "calls": math.ceil(n * cpr - 1e-9),
                    }
                break
            used += r["rollouts"] * per_rollout
            seen += r["rollouts"]
    return best


def estimate_run(task: TaskConfig, base_dir: str | Path) -> dict[str, Any]:
    """The dry-run estimate of ``task`` (see the module docstring); nothing is run or written."""
    from evolve.task.data import load_splits

    splits = load_splits(task.dataset, Path(base_dir), task.seed)
    eng, b = task.engine, task.budget
    sizes = {
        split: len(splits.get(split, [])[:limit] if limit else splits.get(split, []))
        for split, limit in (("train", None), ("val", eng.val_size), ("test", eng.test_size))
    }
    m = min(eng.minibatch, sizes["train"])
    V, T = sizes["val"], sizes["test"]
    cpr, cpr_source = (
        float(b.calls_per_rollout or 1),
        "budget.calls_per_rollout" if b.calls_per_rollout else "assumed 1",
    )
    from evolve.scoring.budget import calls_bound

    graph_bound = calls_bound(dict(task.workflow or {}))
    if not b.calls_per_rollout and graph_bound:
        cpr, cpr_source = float(graph_bound), "the starting workflow graph's bound"
    plan = RunPlan(
        minibatch=m, train=sizes["train"], val=V, generations=b.generations, parents=eng.parents, calls_per_rollout=cpr
    )
    ops = _operator_costs(task, plan)
    price = _pricing(task)
    per_parent = {k: sum(o[k] for o in ops) for k in ("rollouts", "llm_calls", "children")}
    s = eng.reeval.samples if eng.reeval is not None else 0
    rows = [_row("baseline val", V, cpr, 0, price, generation=0, parents=0, children=0)]
    pool = 1
    for g in range(1, b.generations + 1):
        parents = min(eng.parents, pool)
        children = parents * per_parent["children"]
        rollouts = parents * (m + per_parent["rollouts"] + s * V) + children * (m + V + 2 * s * V)
        rows.append(
            _row(
                f"gen {g}",
                rollouts,
                cpr,
                parents * per_parent["llm_calls"],
                price,
                generation=g,
                parents=parents,
                children=children,
            )
        )
        pool += children
    promoted = b.generations > 0 and per_parent["children"] > 0
    final = [_row("final test*", T * (2 if promoted else 1), cpr, 0, price)] if T else []
    notes = [
        "a maximum: children that fail stage 1 skip val, rediscovered children and memoised rollouts cost nothing",
        f"LLM calls per rollout: {cpr:g}, "
        + (cpr_source if cpr_source != "assumed 1" else "assumed (set budget.calls_per_rollout)"),
        price["tokens_note"],
        f"money: {price['price']} (model {price['model']!r}, role {price['role']!r})",
        "*final test: the baseline and the promoted system scored on test, outside every budget",
    ]
    unknown = [o["name"] for o in ops if not o["declared"]]
    if unknown:
        notes.append(
            f"operators without an estimate() (own rollouts and LLM calls unknown, counted as their "
            f"'children' or 1 child): {', '.join(unknown)}"
        )
    if eng.reeval is not None:
        notes.append(f"engine.reeval: counts {s} more val samples for every child twice and every parent once")
    if b.seconds is not None:
        notes.append(f"budget.seconds = {b.seconds:g} is not estimated (no timing before a run)")
    stop = _stop(task, rows, cpr, price)
    in_budget = _total(rows, "in the budget")
    return {
        "task": task.name,
        "seed": task.seed,
        "sizes": {**sizes, "minibatch": m},
        "calls_per_rollout": cpr,
        "calls_per_rollout_source": cpr_source,
        "operators": ops,
        "pricing": price,
        "phases": rows,
        "in_budget": in_budget,
        "final": final[0] if final else _total([], "final test*"),
        "total": _total(rows + final, "total"),
        "stop": stop,
        "notes": notes,
    }
