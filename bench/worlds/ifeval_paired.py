"""Two systems' IFEval figures on the same prompts, and the paired difference: each system is a run
folder and a system id (prefix) in its archive, scored on a split already (``evolve run`` or
``evolve eval``). The four figures of each, the strict and loose averages' differences B - A with a
95% paired bootstrap interval over prompts, the prompts each wins, and how the replies end (share
cut at the token cap, mean completion tokens). The replies are re-scored by the checkers, so the
verdicts are today's.

    python bench/worlds/ifeval_paired.py runs/base:8f10b8ae runs/star:39121b11 [--split test] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evolve.archive.store import Archive
from evolve.types import LLMCall
from evolve.worlds.ifeval import dataset, reward, summary
from evolve.worlds.ifeval.scoring import paired

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ifeval" / "input_data.jsonl"


def replies(where: str, split: str) -> tuple[str, dict[str, tuple[str, str | None, int]]]:
    """(the full system id, task id -> (reply, finish reason, completion tokens)) of ``run:system``."""
    run, _, prefix = where.partition(":")
    archive = Archive(run, create=False, read_only=True)
    out: dict[str, dict[str, tuple[str, str | None, int]]] = {}
    for t in archive.trajectories(split=split, phase="eval"):
        if t.system_id.startswith(prefix):
            calls = [s for s in t.steps if isinstance(s, LLMCall)]
            last = calls[-1] if calls else None
            reply = str((t.output or {}).get("reply", "")) if isinstance(t.output, dict) else ""
            out.setdefault(t.system_id, {})[t.task_id] = (
                reply,
                last.finish_reason if last else None,
                sum(c.completion_tokens for c in calls),
            )
    if len(out) != 1:
        raise SystemExit(f"{where}: {len(out)} systems match {prefix!r} on {split} ({sorted(out)}); give a longer id")
    return next(iter(out.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="run folder:system id of system A (the reference)")
    ap.add_argument("b", help="run folder:system id of system B")
    ap.add_argument("--split", default="test")
    ap.add_argument("--path", type=Path, default=DATA, help="IFEval's input_data.jsonl (the test split)")
    ap.add_argument("--seed", type=int, default=0, help="the runs' seed (generated val prompts)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    d = dataset(seed=args.seed, path=str(args.path), n_train=0, n_val=1000 if args.split == "val" else 0)
    tasks = {t["id"]: t for t in d[args.split]}
    (ida, ra), (idb, rb) = replies(args.a, args.split), replies(args.b, args.split)
    common = sorted(set(ra) & set(rb) & set(tasks))
    if not common:
        raise SystemExit("no prompt was scored by both systems")
    out: dict = {"a": ida, "b": idb, "split": args.split, "n": len(common)}
    comps = {}
    for name, r in (("a", ra), ("b", rb)):
        rewards = [reward(tasks[k], {"reply": r[k][0]}) for k in common]
        s = summary([tasks[k] for k in common], rewards)
        comps[name] = [x.components for x in rewards]
        out[name + "_figures"] = {k: round(100 * v, 1) for k, v in s["figures"].items()}
        out[name + "_intervals"] = {k: [round(100 * x, 1) for x in v] for k, v in s["intervals"].items()}
        out[name + "_cut_at_cap"] = round(sum(r[k][1] == "length" for k in common) / len(common), 3)
        out[name + "_mean_tokens"] = round(sum(r[k][2] for k in common) / len(common), 1)
        out[name + "_echo"] = round(s["echo"], 3)
    p = paired(comps["a"], comps["b"])
    for k in ("strict", "loose"):
        out[k + "_difference"] = round(100 * p[k]["difference"], 1)
        out[k + "_interval"] = [round(100 * x, 1) for x in p[k]["interval"]]
    out["b_better"], out["a_better"] = p["b_better"], p["a_better"]
    for k, v in out.items():
        print(f"{k:20s} {v}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
