"""What replies that do not try score on IFEval: the floors a reader needs to place a system's
figures. Each arm here is a fixed rule, no model: an empty reply, one fixed sentence, and the
prompt repeated back. Scored with world: ifeval's checkers on all prompts of the file, or with
``--split unseen`` on the world's 200 generated prompts with held-out parameters.

    python bench/worlds/ifeval_floors.py [--path ../shared/data/ifeval/input_data.jsonl] [--split unseen]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evolve.worlds.ifeval import dataset, read_prompts, reward, summary

FLOORS = {
    "empty reply": lambda p: "",
    "'My answer is yes.'": lambda p: "My answer is yes.",
    "the prompt repeated back": lambda p: p,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--path",
        type=Path,
        default=Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ifeval" / "input_data.jsonl",
    )
    ap.add_argument("--split", choices=("test", "unseen"), default="test")
    args = ap.parse_args()
    if args.split == "unseen":
        tasks = dataset(seed=0, path=str(args.path), n_train=0, n_val=0)["unseen"]
    else:
        tasks = [{**p, "id": str(p["key"]), "split": "test"} for p in read_prompts(args.path)]
    rows = {}
    for name, reply in FLOORS.items():
        s = summary(tasks, [reward(t, {"reply": reply(t["prompt"])}) for t in tasks])
        rows[name] = {k: round(100 * v, 1) for k, v in s["figures"].items()}
        rows[name]["strict_ci"] = [round(100 * x, 1) for x in s["intervals"]["strict"]]
        print(f"{name:28s} " + "  ".join(f"{k} {v}" for k, v in rows[name].items()))
    print(json.dumps({"split": args.split, "n": len(tasks), "floors": rows}))


if __name__ == "__main__":
    main()
