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

from test_topology import node_order, run, vote_graph


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

    wf = Workflow.from_json({
        "entry": "vote", "nodes": [
            {"id": "vote", "type": "vote", "params": {"chain": ["sample", "parse"], "n": 4, "key": "result",
                                                      "parallel": 4}},
            {"id": "sample", "type": "llm", "params": {"prompt": "{question}"}},
            {"id": "parse", "type": "tool", "params": {"fn": "json:loads", "args": {"s": "text"}}},
            {"id": "answer", "type": "answer", "params": {"key": "result"}}],
        "edges": [{"src": "vote", "dst": "answer"}]})
    traj = run(wf, ScriptedLM("p", reply))
    assert not traj.ok and "node 'parse' (tool) raised JSONDecodeError" in traj.error
    assert sum(isinstance(s, LLMCall) for s in traj.steps) == 4  # every sample's steps are kept
    assert node_order(traj) == ["sample", "parse"] * 4 + ["vote"]
