"""The topology operator inside the engine: a search run end to end with the scripted LM, and
the run report showing every workflow it tried with its accuracy and model calls per task."""

import evolve


def test_topology_search_through_the_engine_reports_accuracy_against_calls(tmp_path):
    graph = {"entry": "ask", "nodes": [{"id": "ask", "type": "llm", "params": {"prompt": "{q}"}},
                                       {"id": "answer", "type": "answer", "params": {"key": "text"}}],
             "edges": [{"src": "ask", "dst": "answer"}]}
    palette = [{"name": "vote", "kind": "wrap", "chain_types": ["llm"], "params": {"key": "text"}, "grid": {"n": [3]}}]
    task = {
        "name": "g", "seed": 0, "agent": "evolve.topology:agent", "reward": "_agents:vowel_reward",
        "models": {"policy": {"backend": "scripted", "name": "echo", "params": {"echo": True}}},
        "workflow": {"graph": graph}, "dataset": {"source": "_agents:vowel_dataset"},
        "operators": [{"name": "topology", "params": {"palette": palette, "max_evals": 3, "search_tasks": 5,
                                                      "cost_weight": 0.0}}],
        "runner": {"name": "thread", "workers": 2, "timeout": 10},
        "budget": {"generations": 1}, "engine": {"minibatch": 4},
    }
    report = evolve.run(task, out=tmp_path / "r")
    tried = report["workflows_tried"]
    assert {r["workflow"] for r in tried} == {"ask -> answer", "vote{n=3} -> answer"}
    calls = {r["workflow"]: r["calls"] for r in tried}
    assert calls == {"ask -> answer": 1.0, "vote{n=3} -> answer": 3.0}  # measured from the trajectories
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Workflows tried by the topology search" in md and "| 3.00 |" in md
