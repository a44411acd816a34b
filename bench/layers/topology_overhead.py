"""Overhead of the topology search per evaluated workflow, beside what an evaluation costs.

    .venv/bin/python bench/layers/topology_overhead.py [--sizes 4 16 64] [--evals 50] [--tasks 50] [--seed 0] [--repeats 3]

Part 1 — the search alone: MCTS from a root graph of N nodes (a chain of sql.write / sql.execute
steps ending in an answer node; the SQL world's node types from the real registry, so validation
checks their real ``Params``) with a scripted evaluate that costs nothing (a score hashed from the
graph id). Reports, per evaluated workflow: the whole search's time; the part spent listing a
node's candidate edits (``candidate_edits``), and building, normalising, deduplicating and
validating the ones tried (``realize``; of it, ``validate``); and MCTS bookkeeping (the rest:
selection, UCT, priors, backpropagation, ids). Also how many edits the root offers (candidates,
and distinct valid results as ``enumerate_edits`` gives them, which the search never computes
whole: it builds an edit only when it tries it). Times are medians over --repeats runs.

Part 2 — a real evaluation for scale: one workflow scored on --tasks tasks through
``evolve.rollout.run_agent`` with the runtime's generic agent and the scripted LM (no model cost
at all), for a one-step graph and a 5-sample vote.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import statistics
import time

import evolve.topology.edits as edits_mod
import evolve.topology.search as search_mod
from evolve.topology.graph import Edge, Node, Workflow

PALETTE = [
    {
        "name": "repair",
        "type": "sql.rewrite",
        "kind": "loop",
        "at": "sql.execute",
        "when": ["error", "error or empty"],
        "max_visits": [1, 2, 3],
    },
    {
        "name": "vote",
        "kind": "wrap",
        "chain_types": ["sql.write", "sql.execute"],
        "params": {"key": "rows", "exclude_when": "error"},
        "grid": {"n": [3, 5, 8], "temperature": [0.5, 0.8, 1.0]},
    },
    {"name": "check", "type": "check", "kind": "step", "params": {"expr": "rows"}},
    {"name": "reflect", "type": "reflect", "kind": "step"},
]


def chain_graph(n: int) -> Workflow:
    """write0 -> run0 -> write1 -> run1 -> ... -> answer: n nodes in all."""
    ids = [f"{'write' if i % 2 == 0 else 'run'}{i // 2}" for i in range(n - 1)]
    nodes = [Node(id=i, type="sql.write" if i.startswith("write") else "sql.execute") for i in ids]
    nodes.append(Node(id="answer", type="answer", params={"fields": ["sql", "rows"]}))
    edges = [Edge(src=a.id, dst=b.id) for a, b in zip(nodes, nodes[1:])]
    return Workflow(entry=nodes[0].id, nodes=tuple(nodes), edges=tuple(edges))


def scripted_evaluate(wf: Workflow) -> tuple[float, float]:
    h = int(hashlib.sha256(wf.id.encode()).hexdigest()[:8], 16)
    return (h % 1000) / 1000, float(len(wf.nodes))


class Timer:
    """Wraps a module function and sums the time spent in it."""

    def __init__(self, module, name: str) -> None:
        self.module, self.name, self.fn = module, name, getattr(module, name)
        self.seconds, self.calls = 0.0, 0

    def __enter__(self) -> Timer:
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return self.fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += 1

        setattr(self.module, self.name, timed)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.module, self.name, self.fn)


def bench_search(size: int, evals: int, seed: int) -> dict:
    from evolve.registry import node_types

    root = chain_graph(size)
    with (
        Timer(search_mod, "candidate_edits") as cand,
        Timer(search_mod, "realize") as real,
        Timer(edits_mod, "validate") as val,
    ):
        t0 = time.perf_counter()
        result = search_mod.search(
            root, scripted_evaluate, PALETTE, node_types, max_evals=evals, seed=seed, max_nodes=size + 8
        )
        total = time.perf_counter() - t0
    n = result.evaluations
    t0 = time.perf_counter()
    valid = len(edits_mod.enumerate_edits(root, PALETTE, node_types))
    whole = time.perf_counter() - t0
    return {
        "size": size,
        "evals": n,
        "iterations": result.iterations,
        "listed": cand.calls,
        "built": real.calls,
        "candidates": len(edits_mod.candidate_edits(root, PALETTE, node_types)),
        "valid": valid,
        "validations": val.calls,
        "total_ms": 1000 * total / n,
        "list_ms": 1000 * cand.seconds / n,
        "realize_ms": 1000 * real.seconds / n,
        "validate_ms": 1000 * val.seconds / n,
        "mcts_ms": 1000 * (total - cand.seconds - real.seconds) / n,
        "enumerate_all_ms": 1000 * whole,
    }


def bench_real(tasks: int) -> list[dict]:
    from evolve.llm.fake import ScriptedLM
    from evolve.rollout import run_agent
    from evolve.topology import agent
    from evolve.types import ModelSpec, System

    lm = ScriptedLM(responses=lambda messages, temperature=None: "right" if temperature else "wrong")
    gen = {"id": "gen", "type": "llm", "params": {"prompt": "{q}"}}
    answer = {"id": "answer", "type": "answer", "params": {"key": "text"}}
    graphs = {
        "llm -> answer (1 call)": {"entry": "gen", "nodes": [gen, answer], "edges": [{"src": "gen", "dst": "answer"}]},
        "vote n=5 over llm -> answer (5 calls)": {
            "entry": "vote",
            "nodes": [{"id": "vote", "type": "vote", "params": {"chain": ["gen"], "n": 5, "key": "text"}}, gen, answer],
            "edges": [{"src": "vote", "dst": "answer"}],
        },
    }
    rows = []
    items = [{"id": f"t{i}", "q": f"question {i}"} for i in range(tasks)]
    for label, graph in graphs.items():
        system = System(
            workflow={"agent": "evolve.topology:agent", "graph": graph},
            models={"policy": ModelSpec(backend="scripted", name="s")},
        )
        run_agent(agent, system, items[0], lambda s, role: lm)  # warm: imports, prepare()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            trajs = [run_agent(agent, system, t, lambda s, role: lm, seed=i) for i, t in enumerate(items)]
            times.append(time.perf_counter() - t0)
            assert all(t.error is None for t in trajs), trajs[0].error
        rows.append({"workflow": label, "ms": 1000 * statistics.median(times)})  # median of 3
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--evals", type=int, default=50, help="evaluations per search")
    ap.add_argument("--tasks", type=int, default=50, help="tasks per real evaluation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="runs per size (the same search); medians are shown")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}; evaluations per search: {args.evals}\n")
    print(
        "| root nodes | evaluated | root edits: candidates / valid distinct | nodes listed | edits built | "
        "validations | search ms / eval | listing ms / eval | build+validate ms / eval | of it validate | "
        "MCTS bookkeeping ms / eval | all root edits built+validated, ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    from evolve.registry import node_types

    edits_mod.enumerate_edits(chain_graph(4), PALETTE, node_types)  # warm: imports of the node types
    for size in args.sizes:
        runs = [bench_search(size, args.evals, args.seed) for _ in range(args.repeats)]
        r = {k: statistics.median(x[k] for x in runs) if k.endswith("_ms") else runs[0][k] for k in runs[0]}
        print(
            f"| {r['size']} | {r['evals']} | {r['candidates']} / {r['valid']} | {r['listed']} | {r['built']} | "
            f"{r['validations']} | {r['total_ms']:.1f} | {r['list_ms']:.2f} | {r['realize_ms']:.1f} | "
            f"{r['validate_ms']:.1f} | {r['mcts_ms']:.2f} | {r['enumerate_all_ms']:.0f} |"
        )
    try:
        rows = bench_real(args.tasks)
    except ImportError as e:  # the runtime is not installed in this checkout
        print(f"\n(real evaluation skipped: {e})")
        return
    print(
        f"\n| one real evaluation: {args.tasks} tasks, run_agent + runtime, scripted LM | ms / workflow | ms / task |"
    )
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['workflow']} | {r['ms']:.1f} | {r['ms'] / args.tasks:.2f} |")


if __name__ == "__main__":
    main()
