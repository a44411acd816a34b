"""The wandb tracker in offline mode (never the network): what W&B wrote is read back from its
offline run files (the transaction log `wandb sync` uploads) and compared with the archive."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from evolve.trackers import TrackedRun
from tests.trackers.conftest import toy, write_task
from tests.trackers.wandb_records import history, of_type, records

pytest.importorskip("wandb")

OFFLINE = [{"name": "wandb", "params": {"mode": "offline"}}]


def _logs(run_dir: Path, n: int = 1, timeout: float = 60) -> list[Path]:
    """The run's offline transaction logs once ``n`` of them end with their exit record (W&B's
    service writes the end of a log shortly after ``finish()`` has returned)."""
    deadline = time.time() + timeout
    while True:
        logs = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        done = [p for p in logs if of_type(records(p), "exit")]
        if len(done) >= n or time.time() > deadline:
            return logs
        time.sleep(0.1)


def _expected(run_dir: Path) -> tuple[dict[int, dict[str, float]], str, str]:
    with Archive(run_dir, create=False) as a:
        run = TrackedRun(a, run_dir)
        return (
            dict(run.metrics()),
            a.current(),
            run.recall(
                next(iter(k.removeprefix("track/") for k in a.state_items("track/wandb") if k.endswith("/toy")))
            )["id"],
        )


def test_an_offline_run_holds_the_generations_config_report_and_promoted_system(tmp_path):
    report = evolve.run(toy(track=OFFLINE), out=tmp_path / "run")
    metrics, current, run_id = _expected(tmp_path / "run")
    logs = _logs(tmp_path / "run")
    assert len(logs) == 1 and logs[0].name == f"run-{run_id}.wandb"
    recs = records(logs[0])
    got = history(recs)
    assert sorted(got) == sorted(metrics) == list(range(5))
    for step, values in metrics.items():
        assert got[step] == pytest.approx(values), step
    assert "median_val" in got[1] and "median_val" not in got[3]  # generation 3 proposed nothing new
    config = {i.key: json.loads(i.value_json) for c in of_type(recs, "config") for i in c.update}
    assert config["budget"]["generations"] == 4 and config["operators"][0]["name"] == "scripted"
    assert "track" not in config
    summary = {i.key: json.loads(i.value_json) for s in of_type(recs, "summary") for i in s.update if i.key}
    assert summary["best_test"] == report["best"]["test"]["score"] and summary["current_system"] == current
    arts = {a.type: a for a in of_type(recs, "artifact")}
    assert {e.path for e in arts["report"].manifest.contents} == {"report.json", "report.md"}
    model = arts["model"]
    assert model.name == "evolve-toy" and {"champion", f"system-{current[:12]}"} <= set(model.aliases)
    assert json.loads(model.metadata)["system_id"] == current
    staged = {e.path: e.local_path for e in model.manifest.contents}
    assert json.loads(Path(staged["system.json"]).read_text())["id"] == current  # what `wandb sync` uploads
    assert of_type(recs, "exit")[-1].exit_code == 0


def test_a_resumed_run_continues_the_same_wandb_run_and_sends_each_generation_once(tmp_path):
    evolve.run(toy(track=OFFLINE, budget={"generations": 2}), out=tmp_path / "run")
    first = _logs(tmp_path / "run")
    evolve.run(toy(track=OFFLINE), out=tmp_path / "run", resume=True)  # budget: 4 generations
    metrics, _, run_id = _expected(tmp_path / "run")
    logs = _logs(tmp_path / "run", 2)
    assert len(first) == 1 and len(logs) == 2 and all(p.name == f"run-{run_id}.wandb" for p in logs)
    steps = [sorted(history(records(p))) for p in logs]
    assert steps == [[0, 1, 2], [3, 4]]
    got = {s: v for p in logs for s, v in history(records(p)).items()}
    assert all(got[s] == pytest.approx(v) for s, v in metrics.items())


def test_evolve_track_writes_a_finished_run_offline_afterwards(tmp_path, capsys):
    from evolve.cli.commands import main

    evolve.run(toy(budget={"generations": 1}), out=tmp_path / "run")
    main(["track", str(tmp_path / "run"), "--to", "wandb", "--param", "mode=offline", "--param", "project=later"])
    out = capsys.readouterr().out
    assert "2 generations" in out and "the report" in out
    (log,) = _logs(tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        metrics = dict(TrackedRun(a).metrics())
    got = history(records(log))
    assert sorted(got) == sorted(metrics) and all(got[s] == pytest.approx(v) for s, v in metrics.items())


def test_online_without_a_reachable_server_is_refused_before_the_run_starts(tmp_path):
    import subprocess
    import sys

    from tests.helpers.upstream import free_port

    url = f"http://127.0.0.1:{free_port()}"
    task = write_task(
        tmp_path, toy(track=[{"name": "wandb", "params": {"mode": "online", "base_url": url, "timeout": 2}}])
    )
    r = subprocess.run(
        [sys.executable, "-m", "evolve", "run", str(task), "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "wandb tracker cannot reach" in r.stderr and url in r.stderr and "mode: offline" in r.stderr
    assert not (tmp_path / "run").exists()
