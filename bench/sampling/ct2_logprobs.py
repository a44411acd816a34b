"""What log-probs at a temperature cost CTranslate2, this checkout's sampler against an earlier
revision's, on one generator in one process (issue 51).

CTranslate2's step log-prob is untempered. Up to ff1873c, ``policy/ct2_server.py`` recomputed a
tempered batch's log-probs by one forward pass over prompt and reply; since then the sampling call
returns each step's logits (``return_logits_vocab``) and the log-probs are their tempered softmax.
Each repeat runs, on the same prompts and the same int8 SmolLM2 generator (two one-thread workers, as
the server on 2 cores): the revision's ``generate`` with log-probs, this checkout's with log-probs,
and this checkout's without them (``logprobs=False``, what STaR's samples ask). Medians of
``--repeats`` after a warm-up of each, tokens per wall second. Then one more sample's log-probs are
compared with the revision's forward pass over the same tokens (in int8 that pass computes other
logits than the ones sampled from: how far apart, per token).

    python bench/sampling/ct2_logprobs.py --against ff1873c --batches 8,64 --repeats 5 --temperature 0.4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import ct2_speed  # noqa: E402  # maps policy/ as evolve.policy where the checkout is not installed


def server_at(rev: str):
    """``policy/ct2_server.py`` as it was at ``rev`` (a module loaded from ``git show``)."""
    try:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:policy/ct2_server.py"], check=True, capture_output=True, text=True
        ).stdout
    except subprocess.CalledProcessError as e:
        sys.exit(f"ct2_logprobs: git cannot show policy/ct2_server.py at {rev!r}: {e.stderr.strip()}")
    path = Path(tempfile.mkdtemp(prefix="ct2-rev-")) / "ct2_server_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("ct2_server_rev", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="ff1873c", help="the revision whose sampler is compared")
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.4)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=2, help="CTranslate2's one-thread workers")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.temperature in (0.0, 1.0):
        sys.exit("ct2_logprobs: at T 0 and 1 CTranslate2's own step log-probs are used; pick another --temperature")

    import ctranslate2

    from evolve.artifacts import file_sha256
    from evolve.policy import ct2_server
    from evolve.policy.ct2 import converted

    old = server_at(args.against)
    base, model, tok = ct2_speed.smollm2(SimpleNamespace(smollm2_shape=None, device="cpu", torch_dtype="float32"))
    del model
    entry = converted(base, file_sha256(base), None, None, "int8")
    g = ctranslate2.Generator(
        str(entry), device="cpu", compute_type="int8", intra_threads=1, inter_threads=args.parallel
    )
    vocab = len(json.loads((entry / "vocabulary.json").read_text()))
    questions = ct2_speed.bench_module("sampling/smollm_speed").QUESTIONS
    eos = list(getattr(tok, "eos_ids", (tok.eos_id,)))
    record = {
        "machine": ct2_speed.machine(args.parallel),
        "against": args.against,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new,
        "repeats": args.repeats,
        "runs": [],
    }
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}), flush=True)

    for batch in (int(b) for b in args.batches.split(",")):
        prompts = [
            tok.render_chat([{"role": "user", "content": q}])
            for q in (questions * (batch // len(questions) + 1))[:batch]
        ]

        def once(gen, module, logprobs: bool, kw: dict, prompts=prompts) -> float:
            reqs = [
                SimpleNamespace(
                    prompt=p, temperature=args.temperature, max_tokens=args.max_new, stop=(), logprobs=logprobs
                )
                for p in prompts
            ]
            t = time.perf_counter()
            out = module.generate(gen, reqs, eos, tok.token_text, parallel=args.parallel, **kw)
            wall = time.perf_counter() - t
            if any((s.logprobs is not None) != logprobs for s in out):
                raise SystemExit("ct2_logprobs: a completion's log-probs are not what it asked")
            return sum(len(s.token_ids) for s in out) / wall

        ways = {
            f"{args.against}, with log-probs": (old, True, {}),
            "this checkout, with log-probs": (ct2_server, True, {"vocab": vocab}),
            "this checkout, without log-probs": (ct2_server, False, {"vocab": vocab}),
        }
        for module, logprobs, kw in ways.values():  # a warm-up of each way
            once(g, module, logprobs, kw)
        rates: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.repeats):
            for name, (module, logprobs, kw) in ways.items():
                rates[name].append(once(g, module, logprobs, kw))
        # the same samples' log-probs as the revision's forward pass computes them (int8: another computation)
        reqs = [
            SimpleNamespace(prompt=p, temperature=args.temperature, max_tokens=args.max_new, stop=(), logprobs=True)
            for p in prompts
        ]
        drawn = ct2_server.generate(g, reqs, eos, tok.token_text, parallel=args.parallel, vocab=vocab)
        again = old.tempered_log_probs(g, prompts, [s.token_ids for s in drawn], args.temperature, args.parallel)
        gaps = [abs(a - b) for s, r in zip(drawn, again) for a, b in zip(s.logprobs, r)]
        run = {
            "batch": batch,
            "tokens_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
            "each": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "drawn against a forward pass, |log-prob gap|": {
                "tokens": len(gaps),
                "mean": round(statistics.fmean(gaps), 4),
                "max": round(max(gaps), 4),
                "over 0.1": round(sum(x > 0.1 for x in gaps) / len(gaps), 3),
            },
        }
        record["runs"].append(run)
        print(json.dumps(run), flush=True)
    del g  # a Generator alive at interpreter exit can abort the process
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
