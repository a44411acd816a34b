"""A greedy evaluation's long replies with CTranslate2: this checkout's model server against an earlier
revision's, each run in its own process (issue 62 item 4).

SmolLM2-135M-Instruct in int8 (the server's CPU plan: two one-thread workers on 2 cores) answers IFEval's
prompts (``../shared/data/ifeval/input_data.jsonl`` beside the checkout, field ``prompt``; used here to measure speed,
never to train) as an evaluation asks: its chat template with the user message only, greedy, at most
``--max-new`` new tokens, every request submitted at once to a ``CT2Server`` that takes ``--batch``
at a time (an evaluation's 32 rollouts at once by default: ``runner.workers``). ``--n`` prompts,
evenly spaced over the 541. The runs alternate (the revision, this checkout, the revision, ...), each
in a fresh process: a CPU server changes the process's malloc for good (``keep_heap``). Every run's replies (token
ids) must equal the first run's. Per run: wall seconds, the process's CPU seconds (user + system) and
minor page faults, tokens, and the replies that stopped at the cap. The 541 prompts' time is the median
scaled by 541 / n: an extrapolation, not a measurement, unless ``--n 541``.

    python bench/sampling/ct2_long.py --against 01a1e0d --n 32 --max-new 1280 --repeats 2 --out bench/sampling/ct2_long.json
    python bench/sampling/ct2_long.py --against none --n 541 --max-new 1280 --repeats 1   # the whole evaluation, once
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ct2_logprobs  # noqa: E402
import ct2_speed  # noqa: E402  (maps policy/ as evolve.policy where the checkout is not installed)

IFEVAL = HERE.parents[2].parent / "shared" / "data" / "ifeval" / "input_data.jsonl"  # beside the checkout
THIS = "this checkout"


def one_run(args: argparse.Namespace) -> None:
    """One way, in this process: the replies and the costs, as JSON into ``--result``."""
    from evolve.artifacts import file_sha256
    from evolve.policy import ct2, ct2_server
    from evolve.policy.ct2 import describe, plan

    module = ct2_server if args.one == THIS else ct2_logprobs.server_at(args.one)
    base, model, tok = ct2_speed.smollm2(SimpleNamespace(smollm2_shape=None, device="cpu", torch_dtype="float32"))
    del model
    lines = [json.loads(x)["prompt"] for x in args.prompts.read_text().splitlines() if x.strip()]
    picked = [lines[i * len(lines) // args.n] for i in range(min(args.n, len(lines)))]
    prompts = [tok.render_chat([{"role": "user", "content": q}]) for q in picked]
    params = {"engine": "ctranslate2", "compute_type": "int8", "threads": args.parallel}
    server = module.CT2Server(
        base, file_sha256(base), describe(base), plan(params, tiny=False), name="smollm2", max_batch=args.batch
    )
    server.add_base()
    server.generator(None)  # loaded before the clock starts
    heap = {None: "not asked (the revision's server)", True: "kept (keep_heap)", False: "not glibc's"}[ct2._heap_kept]
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    futures = [server.submit(p, temperature=0.0, max_tokens=args.max_new, logprobs=True) for p in prompts]
    out = [f.result() for f in futures]
    wall, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    server.close()
    result = {
        "heap": heap,
        "wall_s": round(wall, 1),
        "cpu_s": round(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, 1),
        "sys_s": round(r1.ru_stime - r0.ru_stime, 1),
        "minor_faults": r1.ru_minflt - r0.ru_minflt,
        "max_rss_gib": round(r1.ru_maxrss / 2**20, 2),
        "tokens": sum(len(s.token_ids) for s in out),
        "at_cap": sum(s.finish_reason == "length" for s in out),
        "prompt_tokens": sorted(len(p) for p in prompts),
        "ids": [list(s.token_ids) for s in out],
    }
    args.result.write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--against", default="HEAD", help="the revision whose server is compared ('none': this checkout only)"
    )
    ap.add_argument("--n", type=int, default=32, help="prompts, evenly spaced over the 541")
    ap.add_argument("--max-new", type=int, default=1280)
    ap.add_argument("--batch", type=int, default=32, help="requests the server takes at once (its max_batch)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=2, help="CTranslate2's one-thread workers (params.threads)")
    ap.add_argument("--prompts", type=Path, default=IFEVAL)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one_run(args)

    ways = [THIS] if args.against == "none" else [args.against, THIS]
    record = {
        "machine": ct2_speed.machine(args.parallel),
        "against": args.against,
        "n": args.n,
        "max_new_tokens": args.max_new,
        "batch": args.batch,
        "repeats": args.repeats,
        "runs": [],
    }
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}), flush=True)
    first: list[list[int]] | None = None
    tmp = Path(tempfile.mkdtemp(prefix="ct2-long-"))
    for repeat in range(args.repeats):
        for way in ways:
            res = tmp / f"{repeat}-{ways.index(way)}.json"
            cmd = [
                sys.executable,
                __file__,
                "--one",
                way,
                "--result",
                str(res),
                "--n",
                str(args.n),
                "--max-new",
                str(args.max_new),
                "--batch",
                str(args.batch),
                "--parallel",
                str(args.parallel),
                "--prompts",
                str(args.prompts),
            ]
            load = os.getloadavg()[0]
            subprocess.run(cmd, check=True)
            r = json.loads(res.read_text())
            ids = r.pop("ids")
            record.setdefault("prompt_tokens", r.pop("prompt_tokens"))
            r.pop("prompt_tokens", None)
            first = first if first is not None else ids
            run = {
                "way": way,
                "repeat": repeat,
                "load_1min_before": round(load, 2),
                **r,
                "tokens_per_s": round(r["tokens"] / r["wall_s"], 1),
                "same_replies_as_first_run": ids == first,
                "rows_differing": sum(a != b for a, b in zip(ids, first)),
            }
            record["runs"].append(run)
            print(json.dumps(run), flush=True)
    for key in ("wall_s", "cpu_s"):
        record[f"median_{key}"] = {w: statistics.median(r[key] for r in record["runs"] if r["way"] == w) for w in ways}
    record["all_replies_identical"] = all(r["same_replies_as_first_run"] for r in record["runs"])
    record["541_prompts_s (extrapolated unless n = 541)"] = {
        w: round(v * 541 / args.n) for w, v in record["median_wall_s"].items()
    }
    print(json.dumps({k: v for k, v in record.items() if k not in ("runs", "machine")}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
