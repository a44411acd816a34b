"""evolve.results.rescore: systems of finished runs scored on a larger test split, paired."""

import json

from evolve.api import run_task
from evolve.results import rescore


def test_rescore_scores_archived_systems_on_more_test_tasks_paired_with_the_first(toy_task, tmp_path):
    run = tmp_path / "run"
    report = run_task(toy_task, out=run)
    out = tmp_path / "rescore"
    rows = rescore.main(
        [
            "--task",
            str(toy_task),
            "--seed",
            "0",
            "--n-test",
            "60",
            "--out",
            str(out),
            f"plain={run}:baseline",
            f"best={run}:best",
            f"kid={run}:op:scripted",
        ]
    )["rows"]
    assert [r["label"] for r in rows] == ["plain", "best", "kid"]
    assert all(r["n"] == 60 for r in rows)  # 3x the task file's 20 test tasks
    assert rows[0]["system"] == report["baseline"]["system_id"] and rows[1]["system"] == report["best"]["system_id"]
    d = rows[1]["vs_first"]
    assert d["n"] == 60 and abs(d["diff"] - (rows[1]["accuracy"] - rows[0]["accuracy"])) < 1e-9
    assert rows[1]["accuracy"] > rows[0]["accuracy"]  # the scripted model adds under the evolved instruction
    assert json.loads((out / "rescore.json").read_text())["n_test"] == 60
    # memoised: scoring again runs nothing new and gives the same numbers
    again = rescore.main(
        [
            "--task",
            str(toy_task),
            "--seed",
            "0",
            "--n-test",
            "60",
            "--out",
            str(out),
            f"plain={run}:baseline",
            f"best={run}:best",
        ]
    )["rows"]
    assert [r["accuracy"] for r in again] == [r["accuracy"] for r in rows[:2]]
