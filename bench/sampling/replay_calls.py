"""A finished run's greedy test calls replayed through the local backend, per ``dtype``: how fast the
system's own server answers the calls an evaluation makes (issue 62), apart from the rest of the row.

    python bench/sampling/replay_calls.py runs/dtype_rows/1-torch/seed0/sft_star --dtypes float32,bfloat16

The first turn of up to ``--n`` test rollouts of the run's baseline system (as stored in its archive), sent
by ``--callers`` threads at once to the system's model built from the run's artifacts
(:func:`evolve.policy.local.build`, its adapter attached) with ``params.dtype`` set to each of ``--dtypes``
in turn, greedy, at most ``--max-new`` new tokens, cut at ``--stop`` (the agent's stop strings, as JSON). Per dtype: wall and the process's CPU seconds, tokens,
the server's counters. The base checkpoint the run names must still be where it was (a ``--fresh-cache``
run of ct2_speed.py removes its cache: link the GGUF's cache back as the error says).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import threading
import time
from pathlib import Path


def replay(llm, msgs: list, out: list, k: int, a: argparse.Namespace) -> None:
    """Caller ``k``'s share of the calls: every ``a.callers``-th from ``k``, one after another."""
    for j in range(k, len(msgs), a.callers):
        out[j] = llm.complete(msgs[j], temperature=0.0, max_tokens=a.max_new, stop=a.stop or None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--callers", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--stop", type=json.loads, default=[], help="stop strings as JSON, e.g. '[\"\\n\\n\"]'")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import torch

    from evolve.archive import Archive
    from evolve.policy.local import build, shutdown_all
    from evolve.types import LLMCall

    sid = json.loads((a.run / "report.json").read_text())["baseline"]["system_id"]
    results = []
    with Archive(a.run, create=False, read_only=True) as arch:
        calls = [
            [c for c in t.steps if isinstance(c, LLMCall)] for t in arch.trajectories(sid, "test", "eval", limit=a.n)
        ]
        msgs = [c[0].messages for c in calls if c]
        spec = arch.get_system(sid).models["policy"]
        for dtype in a.dtypes.split(","):
            llm = build(spec.model_copy(update={"params": {**spec.params, "dtype": dtype}}), arch.artifacts)
            llm.complete(msgs[0], temperature=0.0, max_tokens=8)  # warm-up
            out: list = [None] * len(msgs)
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            threads = [threading.Thread(target=replay, args=(llm, msgs, out, k, a)) for k in range(a.callers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            res = {
                "dtype": dtype,
                "weights": str(next(llm.server.base.parameters()).dtype),
                "calls": len(msgs),
                "wall_s": round(time.perf_counter() - t0, 2),
                "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 1),
                "prompt_tokens": sum(len(o.prompt_token_ids or ()) for o in out),
                "tokens": sum(len(o.token_ids) for o in out),
                "server": dict(llm.server.stats),
            }
            print(json.dumps(res), flush=True)
            results.append(res)
            llm.close()
            shutdown_all()
    doc = {
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "run": str(a.run),
        "system": sid,
        "callers": a.callers,
        "max_new_tokens": a.max_new,
        "stop": a.stop,
        "results": results,
    }
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
