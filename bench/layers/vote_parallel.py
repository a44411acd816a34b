"""Wall time of one rollout of a vote workflow when its samples run one after another, and when
``parallel`` runs them at once, against a model with a fixed latency per call (a hosted model's
round trip, simulated by a scripted LM that sleeps; no network).

    .venv/bin/python bench/layers/vote_parallel.py [--latency 0.2] [--n 8] [--parallel 1 4 8] [--rollouts 5]

Each rollout is ``vote{n} -> answer`` over one ``llm`` node (``evolve.topology:agent`` through
``evolve.rollout.run_agent``). Reports the median seconds per rollout and the speed-up over
``parallel`` 1.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from evolve.llm.fake import ScriptedLM
from evolve.rollout import run_agent
from evolve.topology import Workflow, agent
from evolve.types import ModelSpec, System


def graph(n: int, parallel: int) -> Workflow:
    return Workflow.from_json(
        {
            "entry": "vote",
            "nodes": [
                {
                    "id": "vote",
                    "type": "vote",
                    "params": {"chain": ["sample"], "n": n, "key": "text", "parallel": parallel},
                },
                {"id": "sample", "type": "llm", "params": {"prompt": "{question}"}},
                {"id": "answer", "type": "answer", "params": {"key": "text"}},
            ],
            "edges": [{"src": "vote", "dst": "answer"}],
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--rollouts", type=int, default=5)
    args = ap.parse_args()

    def reply(messages, seed=None, temperature=None):
        time.sleep(args.latency)
        return str(seed % 3)

    lm = ScriptedLM("latency", reply)
    print(f"# {platform.machine()}, {platform.python_version()}; latency {args.latency} s per call, vote n={args.n}")
    base = None
    for k in args.parallel:
        system = System(
            workflow={"graph": graph(args.n, k).to_json()}, models={"policy": ModelSpec(backend="scripted", name="p")}
        )
        times = []
        for i in range(args.rollouts):
            t0 = time.perf_counter()
            traj = run_agent(agent, system, {"id": f"t{i}", "question": "q"}, lambda s, role: lm, seed=i)
            times.append(time.perf_counter() - t0)
            assert traj.ok, traj.error
        med = statistics.median(times)
        base = base or med
        print(f"parallel {k:2d}: {med:.3f} s per rollout (median of {args.rollouts}), {base / med:.2f}x")


if __name__ == "__main__":
    main()
