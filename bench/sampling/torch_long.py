"""A greedy evaluation's long replies with our torch sampler, the counterpart of ``ct2_long.py``: would
torch in bf16 (AMX) sample IFEval's long replies faster than CTranslate2 int8 (issue 62 items 3 and 4)?

SmolLM2-135M-Instruct (the GGUF's weights, loaded in ``--dtype``) answers the same prompts as
``ct2_long.py`` picks (``--n`` evenly spaced over the 541 of ``--prompts``; used to measure speed, never
to train): its chat template with the user message only, greedy, at most ``--max-new`` new tokens,
``--batch`` rows per call of :func:`evolve.policy.sampling.sample` (left padding, a preallocated KV cache,
finished rows pruned). Per run: wall and the process's CPU seconds, tokens, replies at the cap; with
``--profile``, torch's profiler table of the first call (which op the time goes to). ``--parts K``
samples the same prompts again in calls of ``K`` rows and says how many replies differ from the first
run's, token for token: whether a reply depends on which rows share its batch (a server's batches
depend on timing), not timed. ``--server`` submits every prompt at once to a
:class:`~evolve.policy.local_server.LocalServer` of ``--batch`` rows instead, which takes waiting prompts
into its running batch as rows end (continuous batching), where the calls above each run until their
longest reply ends; ``--one-group`` makes its decoding steps read every row's cache from the batch's
first column, as before grouped attention.

    python bench/sampling/torch_long.py --n 32 --batch 32 --max-new 512 --dtype bfloat16 --threads 2
    python bench/sampling/torch_long.py --n 32 --batch 32 --max-new 256 --parts 8
    python bench/sampling/torch_long.py --n 64 --batch 32 --max-new 512 --server
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ct2_speed  # noqa: E402  (loads SmolLM2 as ct2_long does)

ROOT = HERE.parents[1]
IFEVAL = ROOT.parent / "shared" / "data" / "ifeval" / "input_data.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=IFEVAL)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--parts", type=int, help="sample the prompts again in calls of this many rows and compare")
    ap.add_argument("--server", action="store_true", help="all prompts at once to a continuous-batching server")
    ap.add_argument(
        "--one-group", action="store_true", help="decoding steps read the cache from the batch's first column"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not args.prompts.is_file():
        sys.exit(f"--prompts {args.prompts}: no such file (IFEval's input_data.jsonl)")

    import torch

    from evolve.policy import sampling
    from evolve.policy.sampling import sample

    if args.one_group:  # every cohort of joined rows reads as one group (no grouped attention)
        sampling.GROUP_SLACK = 1 << 30

    torch.set_num_threads(args.threads)
    _, model, tok = ct2_speed.smollm2(SimpleNamespace(smollm2_shape=None, device="cpu", torch_dtype=args.dtype))
    model.eval()
    lines = [json.loads(x)["prompt"] for x in args.prompts.read_text().splitlines() if x.strip()]
    picked = [lines[i * len(lines) // args.n] for i in range(min(args.n, len(lines)))]
    prompts = [tok.render_chat([{"role": "user", "content": q}]) for q in picked]
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else None
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = []
    batches = None
    if args.server:
        from evolve.policy.local_server import LocalServer

        server = LocalServer(model, tok, max_batch=args.batch, batch_wait=0.05, max_wait=0.5, threads=args.threads)
        futs = [server.submit(p, temperature=0.0, max_tokens=args.max_new) for p in prompts]
        out = [f.result() for f in futs]
        batches = server.stats["batches"]
        server.close()
    for i in range(0, len(prompts) if not args.server else 0, args.batch):
        part = prompts[i : i + args.batch]
        if args.profile and i == 0:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out += sample(model, part, eos_id=tok.eos_ids, temperatures=0.0, max_tokens=args.max_new)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        else:
            out += sample(model, part, eos_id=tok.eos_ids, temperatures=0.0, max_tokens=args.max_new)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = round(time.perf_counter() - t0, 1)
    differ = None
    if args.parts:
        again = []
        for i in range(0, len(prompts), args.parts):
            again += sample(
                model, prompts[i : i + args.parts], eos_id=tok.eos_ids, temperatures=0.0, max_tokens=args.max_new
            )
        differ = sum(a.token_ids != b.token_ids for a, b in zip(out, again))
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "threads": args.threads,
            "load_1min_before": load,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "n": len(prompts),
        "batch": args.batch,
        "server": args.server,
        "server_batches": batches,
        "one_group": args.one_group,
        "max_new_tokens": args.max_new,
        "dtype": args.dtype,
        "profiled": args.profile,
        "wall_s": wall,
        "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 1),
        "tokens": sum(len(s.token_ids) for s in out),
        "at_cap": sum(s.finish_reason == "length" for s in out),
        "parts": args.parts,
        "replies_that_differ_in_parts": differ,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
