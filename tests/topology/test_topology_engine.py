"""The topology operator inside the engine: a search run end to end with the scripted LM, and
the run report showing every workflow it tried with its accuracy and model calls per task."""

import evolve
from tests.helpers.agents import vote_search_task


def test_topology_search_through_the_engine_reports_accuracy_against_calls(tmp_path):
    task = vote_search_task(3, {"max_evals": 3, "search_tasks": 5, "cost_weight": 0.0}, {"generations": 1})
    report = evolve.run(task, out=tmp_path / "r")
    tried = report["workflows_tried"]
    assert {r["workflow"] for r in tried} == {"ask -> answer", "vote{n=3} -> answer"}
    calls = {r["workflow"]: r["calls"] for r in tried}
    assert calls == {"ask -> answer": 1.0, "vote{n=3} -> answer": 3.0}  # measured from the trajectories
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Workflows tried by the topology search" in md and "| 3.00 |" in md
