"""A benchmark of the archive's writes and queries.

python bench/infra/archive_speed.py [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from evolve.archive import Archive
from evolve.types import System, Trajectory


def bench(n_systems: int = 10_000, n_trajectories: int = 100_000, shape: str = "text", compress: int = 0) -> None:
    """Write ``n_systems`` systems and ``n_trajectories`` trajectories, then time the archive's queries."""
    import random
    import statistics

    from evolve.types import LLMCall, Message, ModelSpec, Reward

    rnd = random.Random(0)
    words = "select from where group by order count table join on the of rows column schema answer".split()

    def text(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    def system(i: int) -> System:
        return System(
            models={"policy": ModelSpec(backend="scripted", name="x")},
            prompts={"instruction": f"variant {i}: " + text(120)},
            workflow={"topology": "single", "max_steps": 8},
        )

    def traj(sid: str, i: int) -> Trajectory:
        steps: tuple[Any, ...] = ()
        if shape != "small":
            lp = shape == "logprobs"
            steps = tuple(
                LLMCall(
                    role="policy",
                    model="tiny",
                    messages=(Message(role="system", content=text(150)), Message(role="user", content=text(40))),
                    output=text(40),
                    token_ids=tuple(rnd.randrange(32000) for _ in range(64)) if lp else None,
                    logprobs=tuple(-rnd.random() * 3 for _ in range(64)) if lp else None,
                    prompt_tokens=250,
                    completion_tokens=64,
                )
                for _ in range(2)
            )
        return Trajectory(
            task_id=f"task-{i % 200}",
            system_id=sid,
            steps=steps,
            output="42",
            reward=Reward(score=rnd.random(), feedback="wrong count"),
            tokens=628,
            cost=0.001,
        )

    def ms(t: float) -> str:
        return f"{t * 1e3:.2f} ms"

    root = Path(tempfile.mkdtemp(prefix="evolve-archive-bench-"))
    try:
        a = Archive(root / "run", compress=compress)
        systems = [system(i) for i in range(n_systems)]
        t0 = time.perf_counter()
        ids: list[str] = []
        for i, s in enumerate(systems):
            ids.append(
                a.add_system(s, parents=(ids[(i - 1) // 2],) if i else (), operator="mutate", generation=i // 100)
            )
        dt = time.perf_counter() - t0
        print(f"add_system x{n_systems}: {dt:.2f} s ({dt / max(n_systems, 1) * 1e6:.0f} us each)")
        samples = [traj(ids[i % min(100, len(ids))] if ids else "s", i) for i in range(1000)]
        print(
            f"trajectory JSON: {statistics.mean(len(t.model_dump_json()) for t in samples[:100]):.0f} bytes ({shape})"
        )
        rows = [(f"k{i}", "val" if i % 3 else "train", "eval", 0, samples[i % 1000]) for i in range(n_trajectories)]
        times = []
        t0 = time.perf_counter()
        for j in range(0, len(rows), 64):
            t1 = time.perf_counter()
            a.add_trajectories(rows[j : j + 64])
            times.append(time.perf_counter() - t1)
        dt = time.perf_counter() - t0
        times.sort()
        print(
            f"add_trajectories x{n_trajectories} in 64-row batches: {dt:.2f} s; per batch median "
            f"{ms(times[len(times) // 2])}, p90 {ms(times[int(len(times) * 0.9)])}"
        )
        extra = [(f"x{i}", "val", "eval", 1, samples[i]) for i in range(1000)]
        t0 = time.perf_counter()
        a.add_trajectories(extra)
        print(f"add_trajectories 1000 rows in one call: {ms(time.perf_counter() - t0)}")
        t0 = time.perf_counter()
        a.add_trajectories(extra)
        print(f"  the same 1000 again (all skipped): {ms(time.perf_counter() - t0)}")
        keys = [f"k{rnd.randrange(n_trajectories)}" for _ in range(1000)]

        def timed(label: str, fn: Any, n: int = 1) -> None:
            t = time.perf_counter()
            for _ in range(n):
                fn()
            print(f"{label}: {ms((time.perf_counter() - t) / n)}")

        timed("get_trajectories 1000 random keys", lambda: a.get_trajectories(keys))
        timed("get_trajectories 64 random keys", lambda: a.get_trajectories(keys[:64]), 20)
        timed("has_keys 64 keys", lambda: a.has_keys(keys[:64]), 20)
        timed("score(system, val)", lambda: a.score(samples[1].system_id, "val"), 50)
        timed("task_scores(system, val)", lambda: a.task_scores(samples[1].system_id, "val"), 20)
        timed("all_scores(val)", lambda: a.all_scores("val"), 3)
        timed("best()", lambda: a.best(), 3)
        if ids:
            timed("get_system(8-char prefix)", lambda: a.get_system(ids[-1][:8]), 50)
            timed("lineage(last)", lambda: a.lineage(ids[-1]), 20)
        timed("records()", lambda: a.records(), 3)
        a._usage = None
        timed("usage() first call", a.usage)
        timed("usage() cached", a.usage, 100)
        timed("trajectories(system, val)", lambda: a.trajectories(samples[1].system_id, "val"), 3)
        a.close()
        size = sum(f.stat().st_size for f in (root / "run").glob("archive.sqlite*"))
        print(f"file size: {size / 1e6:.1f} MB ({size / max(n_trajectories + n_systems, 1):.0f} bytes per row)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if len(args) > 4:
        sys.exit(
            "usage: python bench/infra/archive_speed.py [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]"
        )
    kinds = (int, int, str, int)
    bench(*(k(a) for k, a in zip(kinds, args)))
