"""A vote whose samples run at the same time (``parallel``): really concurrent, deterministic
whatever the thread timing, its steps grouped sample after sample, and a failing sample fails
the trajectory without losing the other samples' steps."""

from __future__ import annotations

import random
import threading
import time

from evolve.llm.fake import ScriptedLM
from evolve.topology import Workflow
from evolve.types import LLMCall
from tests.topology.test_topology import node_order, run, vote_graph


def parallel(wf: Workflow, k: int) -> Workflow:
    graph = wf.to_json()
    for node in graph["nodes"]:
        if node["type"] == "vote":
            node["params"]["parallel"] = k
    return Workflow.from_json(graph)


def test_parallel_samples_run_at_the_same_time():
    barrier = threading.Barrier(4, timeout=10)  # passes only when four calls wait at once

    def reply(messages, seed=None, temperature=None):
        barrier.wait()
        return "a"

    traj = run(parallel(vote_graph(n=4), 4), ScriptedLM("p", reply))
    assert traj.ok, traj.error
    assert traj.output == "a" and sum(isinstance(s, LLMCall) for s in traj.steps) == 4


def test_parallel_votes_are_deterministic_and_grouped_by_sample_whatever_the_timing():
    def reply(messages, seed=None, temperature=None):
        time.sleep(random.random() * 0.02)  # finish in a random order
        return str(seed % 3)

    runs = [run(parallel(vote_graph(n=6, chain_check=True), 3), ScriptedLM("p", reply), seed=5) for _ in range(4)]
    for traj in runs:
        assert traj.ok, traj.error
        assert node_order(traj) == ["sample", "judge"] * 6 + ["vote", "answer"]
    outs = [[s.output for s in t.steps if isinstance(s, LLMCall)] for t in runs]
    assert all(o == outs[0] for o in outs) and len(set(outs[0])) > 1  # same samples, not all alike
    assert {t.output for t in runs} == {runs[0].output}
    # another rollout seed draws other samples
    other = run(parallel(vote_graph(n=6, chain_check=True), 3), ScriptedLM("p", reply), seed=6)
    assert [s.output for s in other.steps if isinstance(s, LLMCall)] != outs[0]


def test_a_failing_parallel_sample_fails_the_trajectory_and_keeps_every_samples_steps():
    def reply(messages, seed=None, temperature=None):
        return "not json" if seed == 3000 else "1"  # branch 2's first call: fork seed 2 + 1, times 1000 calls

    wf = Workflow.from_json(
        {
            "entry": "vote",
            "nodes": [
                {
                    "id": "vote",
                    "type": "vote",
                    "params": {"chain": ["sample", "parse"], "n": 4, "key": "result", "parallel": 4},
                },
                {"id": "sample", "type": "llm", "params": {"prompt": "{question}"}},
                {"id": "parse", "type": "tool", "params": {"fn": "json:loads", "args": {"s": "text"}}},
                {"id": "answer", "type": "answer", "params": {"key": "result"}},
            ],
            "edges": [{"src": "vote", "dst": "answer"}],
        }
    )
    traj = run(wf, ScriptedLM("p", reply))
    assert not traj.ok and "node 'parse' (tool) raised JSONDecodeError" in traj.error
    assert sum(isinstance(s, LLMCall) for s in traj.steps) == 4  # every sample's steps are kept
    assert node_order(traj) == ["sample", "parse"] * 4 + ["vote"]


def test_parallel_samples_keep_the_contexts_additions_and_sequential_visit_numbers():
    from evolve.reflexion.context import LessonContext
    from evolve.rollout import RolloutContext
    from evolve.topology import agent
    from evolve.topology.runtime import Runtime
    from evolve.types import ToolCall
    from tests.topology.test_topology import make_system

    wf = parallel(vote_graph(n=4), 4)
    lm = ScriptedLM("p", lambda messages, seed=None, temperature=None: "a")
    ctx = RolloutContext(make_system(wf), {"id": "t", "question": "q"}, lambda s, r: lm)
    agent(ctx.task, LessonContext(ctx, ["ALWAYS SAY B"], "system"))  # Reflexion around a parallel vote
    calls = [s for s in ctx.steps if isinstance(s, LLMCall)]
    assert len(calls) == 4 and all("ALWAYS SAY B" in " ".join(m.content for m in c.messages) for c in calls)
    # node runs are counted (and recorded as visits) as a sequential vote counts them
    ctx = RolloutContext(make_system(wf), {"id": "t", "question": "q"}, lambda s, r: lm)
    rt = Runtime(ctx, wf)
    rt.execute()
    assert rt.runs["sample"] == 4
    assert [s.args["visit"] for s in ctx.steps if isinstance(s, ToolCall) and s.name == "node:sample"] == [1, 2, 3, 4]


def test_each_fork_gets_its_own_gateway_url_and_join_drops_them():
    from evolve.gateway import rollout_route as gateway
    from evolve.rollout import RolloutContext
    from evolve.types import ModelSpec, System

    lm = ScriptedLM("p", ["a"])
    ctx = RolloutContext(
        System(models={"policy": ModelSpec(backend="scripted", name="p")}), {"id": "t"}, lambda s, r: lm
    )
    forks = [ctx.fork(0), ctx.fork(1)]
    urls = [f.openai_base_url() for f in forks]
    assert urls[0] != urls[1] and not ctx._gateway  # each branch routes to itself; the parent holds none
    assert [gateway._ROUTES[f._gateway["policy"]][0] for f in forks] == forks
    ctx.join(forks)
    assert all(f._gateway["policy"] not in gateway._ROUTES for f in forks)  # no URL outlives its branch
