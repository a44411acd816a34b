"""Per-call overhead of the `process` sandbox backend, beside a plain interpreter start.

    .venv/bin/python bench/infra/sandbox_overhead.py [--n 200] [--batch 1000]

Measures: cold sandboxed call() of a trivial function (p50/p95 over --n calls, and sequential
calls/s), call_many() of --batch small calls in one sandbox, and as the baseline
subprocess.run([sys.executable, "-I", "-c", ...]) with no isolation at all. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time

from evolve.sandbox import Limits, get_sandbox

CODE = "def add(a, b):\n    return a + b\n"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="cold calls to time")
    ap.add_argument("--batch", type=int, default=1000, help="calls in the call_many batch")
    args = ap.parse_args()

    box = get_sandbox("process")
    limits = Limits(wall_s=10)
    box.call(CODE, "add", {"a": 1, "b": 2}, limits=limits)  # warm the page cache

    def sandboxed(i: int) -> None:
        res = box.call(CODE, "add", {"a": i, "b": 1}, limits=limits)
        assert res.ok and res.value == i + 1, res

    def baseline(flags: list[str]):
        def run(i: int) -> None:
            out = subprocess.run(
                [sys.executable, *flags, "-c", f"print({i} + 1)"], capture_output=True, text=True, check=True
            )
            assert out.stdout.strip() == str(i + 1)

        return run

    base = timed(baseline(["-I"]), args.n)
    bare = timed(baseline(["-I", "-S"]), args.n)  # the flags the sandbox runs its interpreter with
    cold = timed(sandboxed, args.n)
    t0 = time.perf_counter()
    batch = box.call_many(CODE, "add", [{"a": i, "b": 1} for i in range(args.batch)], limits=limits)
    batch_s = time.perf_counter() - t0
    assert all(r.ok for r in batch) and [r.value for r in batch] == [i + 1 for i in range(args.batch)]

    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}, kernel {platform.release()}, "
        f"sandbox run as {'root (fresh uid per call)' if box.as_root else 'user (user namespace)'}"
    )
    print()
    print("| measure | p50 | p95 | throughput |")
    print("|---|---|---|---|")
    print(
        f"| baseline: `subprocess.run([python, '-I', '-c', ...])`, no isolation ({args.n} runs) | "
        f"{pct(base, 50) * 1e3:.1f} ms | {pct(base, 95) * 1e3:.1f} ms | {len(base) / sum(base):.1f} runs/s |"
    )
    print(
        f"| baseline: the same with `-I -S` (no site, as inside the sandbox) ({args.n} runs) | "
        f"{pct(bare, 50) * 1e3:.1f} ms | {pct(bare, 95) * 1e3:.1f} ms | {len(bare) / sum(bare):.1f} runs/s |"
    )
    print(
        f"| `process` sandbox, cold `call()` of a trivial function ({args.n} calls) | "
        f"{pct(cold, 50) * 1e3:.1f} ms | {pct(cold, 95) * 1e3:.1f} ms | {len(cold) / sum(cold):.1f} calls/s |"
    )
    print(
        f"| overhead of the sandbox over the bare `-I -S` interpreter start (p50) | "
        f"{(pct(cold, 50) - pct(bare, 50)) * 1e3:+.1f} ms | | |"
    )
    print(
        f"| `process` sandbox, `call_many()` of {args.batch} small calls in one sandbox | "
        f"{statistics.median(r.duration_s for r in batch) * 1e6:.0f} µs per call inside | | "
        f"{args.batch / batch_s:,.0f} calls/s ({batch_s:.2f} s in all) |"
    )


if __name__ == "__main__":
    main()
