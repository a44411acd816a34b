"""What the tool layer buys the tiny SQL agent, on held-out test tasks.

    .venv/bin/python examples/sql_agent/tool_layer.py --seed 0     # 20-22 min (measured with one torch thread beside another run)

1. The plain system: the cold-start model of ``task.yaml`` (SFT on 500 demos), evaluated on the
   300 test tasks (schemas never seen in training).
2. Toolforge mines its successful trajectories on ``--mine`` training tasks: SQL shapes that
   recur in at least ``--min-support`` tasks become parametrised query tools, each admitted only
   if it reproduces the recorded rows of its supporting calls in the sandbox.
3. The tool-using system: the same cold start, same demos, same seed and budget, except that a
   demo whose gold SQL a tool covers shows the tool call instead (``tool_demos``) and the
   system carries the admitted library; every call runs in the sandbox. Evaluated on the same
   test tasks.

A tiny model cannot read a docstring, so it learns the tools the way a fine-tuned
function-calling model does: from demos. The comparison isolates the library: same data, same
training, the only difference is whether the covered answers are tool calls or SQL.
Writes ``runs/tool_layer/seed<N>/summary.json`` and prints one table row. Rerunning resumes: the
rollouts already done are memoised in the two run archives.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _stats(trajs: list, names: set[str]) -> dict:
    from evolve.types import LLMCall, ToolCall

    calls = [sum(isinstance(s, LLMCall) for s in t.steps) for t in trajs]
    toks = [sum(s.completion_tokens for s in t.steps if isinstance(s, LLMCall)) for t in trajs]
    used = [t for t in trajs if any(isinstance(s, ToolCall) and s.name in names for s in t.steps)]
    return {
        "accuracy": round(statistics.mean(t.score for t in trajs), 4),
        "n": len(trajs),
        "model_calls_per_task": round(statistics.mean(calls), 3),
        "completion_tokens_per_task": round(statistics.mean(toks), 2),
        "tasks_using_a_tool": len(used),
        "accuracy_when_a_tool_was_used": round(statistics.mean(t.score for t in used), 4) if used else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mine", type=int, default=1500, help="training tasks rolled out to mine tools from")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--min-support", type=int, default=5)
    ap.add_argument("--out", default="runs/tool_layer")
    args = ap.parse_args(argv)

    from _layers import plain as plain_run

    from evolve.loop.operators import OperatorContext
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.toolforge.operator import ToolForge
    from evolve.toolforge.tool import ToolLibrary, save_library
    from evolve.types import content_hash

    pl = plain_run(args.seed, args.out, mine=args.mine, samples=args.samples)
    out, common, base, sa, test_a, trajs = pl.out, pl.common, pl.base, pl.system, pl.test_trajs, pl.mined
    rng, mine_tasks, plain = random.Random(f"tool_layer/{args.seed}/op"), pl.mine_tasks, pl.engine
    work = out / "toolforge"
    work.mkdir(parents=True, exist_ok=True)
    op = ToolForge(
        min_support=args.min_support, max_new=40, max_tools=40, retire=False, miner="evolve.worlds.sql:mine_tools"
    )
    ctx = OperatorContext(
        generation=1,
        seed=args.seed,
        rng=rng,
        train=plain.tasks("train"),
        trajectories=trajs,
        artifacts=plain.archive.artifacts,
        workdir=work,
        rollouts=lambda *a, **k: [],
        log=print,
    )
    cands = op.propose(sa, ctx)
    if not cands:
        sys.exit("toolforge admitted no tools; see " + str(work / "toolforge.json"))
    lib = ToolLibrary.from_system(cands[0].system)
    tools_file = save_library(lib, out / "tools.json")

    cfg_b, _ = load_task(
        HERE / "task.yaml",
        common + [f"tools={tools_file.resolve()}", "models.policy.cold_start.demos=evolve.worlds.sql:tool_demos"],
    )
    # one run directory per library: a resumed run must not reuse a baseline built with other tools
    run_b = out / f"tools-{content_hash(lib.to_json(), 8)}"
    with_tools = Session(cfg_b, base_dir=base, run_dir=run_b, resume=True)
    sb = with_tools.baseline()
    test_b = with_tools.rollouts(sb, with_tools.tasks("test"), split="test", tag="eval:test")
    with_tools.close()

    names = set(lib.names())
    report = json.loads((work / "toolforge.json").read_text())
    summary = {
        "seed": args.seed,
        "mined_from": {"tasks": len(mine_tasks), "samples": len(trajs), "successes": sum(t.score >= 1 for t in trajs)},
        "tools": {
            "admitted": len(report["admitted"]),
            "rejected": len(report["rejected"]),
            "duplicates": len(report["duplicates"]),
            "names": sorted(names),
        },
        "plain": _stats(test_a, names),
        "with_tools": _stats(test_b, names),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    a, b = summary["plain"], summary["with_tools"]
    print(
        f"| {args.seed} | {a['accuracy']:.1%} | {b['accuracy']:.1%} | {100 * (b['accuracy'] - a['accuracy']):+.1f} | "
        f"{summary['tools']['admitted']} | {b['tasks_using_a_tool']}/{b['n']} | "
        f"{a['completion_tokens_per_task']} → {b['completion_tokens_per_task']} |"
    )
    return summary


if __name__ == "__main__":
    main()
