"""What every tracker shares: the per-generation metrics read from the archive, the task's settings
flattened, the track: section checked when the task file is validated, a destination that is not
there refused before the run starts, and a tracker failing or hanging mid-run never changing the
run's results (tests/trackers/plugins.py holds trackers named by import path)."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

import evolve
from evolve.archive import Archive
from evolve.errors import ConfigError, MissingDependency
from evolve.task.taskfile import validate_task
from evolve.trackers import TrackedRun
from evolve.trackers.base import flat_params
from tests.helpers.upstream import free_port
from tests.trackers.conftest import Messages, toy, write_task
from tests.trackers.plugins import RELEASE, Recorder

RECORDER = "tests.trackers.plugins:Recorder"


def test_the_metrics_are_the_archives_generation_rows_and_the_median_of_each_generations_children(tmp_path):
    report = evolve.run(toy(), out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        metrics = dict(TrackedRun(a).metrics())
        val = a.all_scores("val")
        children = {}
        for r in a.records():
            if r.parents and r.id in val:
                children.setdefault(r.generation, []).append(val[r.id][0])
    rows = report["generations"]
    assert sorted(metrics) == [g["index"] for g in rows] == [0, 1, 2, 3, 4]
    for g in rows:
        m = metrics[g["index"]]
        for key in ("best_val", "children", "accepted", "rollouts", "calls", "tokens", "cost", "seconds"):
            assert m[key] == g[key], (g["index"], key)
        if g["index"] in children:
            assert m["median_val"] == statistics.median(children[g["index"]])
        else:
            assert "median_val" not in m
    assert metrics[1]["median_val"] == 0.65 and metrics[2]["median_val"] == 1.0  # the golden run's children
    assert "median_val" not in metrics[4]  # its only child was rejected on the minibatch: never scored on val


def test_the_task_settings_flattened_leave_out_where_the_run_reports():
    task = {
        "name": "t",
        "budget": {"generations": 2, "usd": None},
        "operators": [{"name": "star", "params": {"k": 1}}],
        "prompts": {"a": "x"},
        "reward_range": [0.0, 1.0],
        "track": [{"name": "mlflow"}],
        "memory": {},
    }
    assert flat_params(task) == {
        "name": "t",
        "budget.generations": "2",
        "budget.usd": "null",
        "operators.0.name": "star",
        "operators.0.params.k": "1",
        "prompts.a": "x",
        "reward_range": "[0.0, 1.0]",
        "memory": "{}",
    }


@pytest.mark.parametrize(
    "track, where, says",
    [
        ([{"name": "mlfow"}], "track.0.name", "unknown tracker 'mlfow'; did you mean 'mlflow'?"),
        ([{"name": "otel"}, {"name": "wanb"}], "track.1.name", "did you mean 'wandb'?"),
        (
            [{"name": "mlflow", "params": {"tracking_ur": "http://x"}}],
            "track.0.params.tracking_ur",
            "unknown field; did you mean 'tracking_uri'?",
        ),
        ([{"name": "wandb", "params": {"mode": "sometimes"}}], "track.0.params.mode", "'online' or 'offline'"),
        ([{"name": "otel", "params": {"timeout": 0}}], "track.0.params.timeout", "greater than 0"),
        ([{"name": "tests.trackers.plugins:Nope"}], "track.0.name", "has no 'Nope'"),
        ([{"name": "mlflow", "param": {}}], "track.0.param", "unknown field; did you mean 'params'?"),
    ],
)
def test_a_mistake_in_the_track_section_is_found_when_the_task_file_is_validated(track, where, says):
    with pytest.raises(ConfigError) as e:
        validate_task(toy(track=track), source="task.yaml")
    assert f"task.yaml: {where}" in str(e.value) and says in str(e.value), str(e.value)


def test_a_tracker_whose_package_is_missing_names_the_install():
    with pytest.raises(MissingDependency) as e:
        validate_task(toy(track=[{"name": "tests.trackers.plugins:NeedsAMissingPackage"}]), source="task.yaml")
    assert "track.0" in str(e.value) and "'evolve_no_such_package'" in str(e.value)
    assert "pip install 'evolvekit[nosuch]'" in str(e.value)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "evolve", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "tracker, params, says",
    [
        (
            "mlflow",
            {"tracking_uri": "http://127.0.0.1:{port}", "timeout": 2},
            "cannot reach the MLflow server at http://127.0.0.1:{port}",
        ),
        (
            "otel",
            {"endpoint": "http://127.0.0.1:{port}", "timeout": 1},
            "cannot reach the OTLP/gRPC collector at http://127.0.0.1:{port}",
        ),
        ("mlflow", {}, "needs a server: set track params.tracking_uri"),
    ],
)
def test_a_destination_that_does_not_answer_stops_the_run_before_its_directory_is_written(
    tmp_path, tracker, params, says
):
    port = free_port()
    params = {k: v.format(port=port) if isinstance(v, str) else v for k, v in params.items()}
    task = write_task(tmp_path, toy(track=[{"name": tracker, "params": params}]))
    r = _cli("run", str(task), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"the {tracker} tracker" in r.stderr and says.format(port=port) in " ".join(r.stderr.split()), r.stderr
    assert not (tmp_path / "run").exists()


def test_a_tracker_failing_mid_run_is_a_warning_and_catches_up_without_changing_results(tmp_path):
    log = tmp_path / "sent.jsonl"
    obs = Messages()
    report = evolve.run(
        toy(track=[{"name": RECORDER, "params": {"log": str(log), "fail_first": 2}}]),
        out=tmp_path / "run",
        observer=obs,
    )
    plain = evolve.run(toy(), out=tmp_path / "plain")
    assert {k: report[k] for k in ("baseline", "best", "paired")} == {
        k: plain[k] for k in ("baseline", "best", "paired")
    }
    lines = Recorder.read(log)
    assert [x["index"] for x in lines if x["event"] == "generation"] == [0, 1, 2, 3, 4]  # each once
    assert lines[0] == {"event": "open"} and lines[-1] == {"event": "close", "status": "finished"}
    failed = obs.about("failed to send")
    assert len(failed) == 1 and "ConnectionError: sync 1 refused" in failed[0] and str(log) in failed[0]
    assert obs.about("caught up") and not obs.about("could not send everything")


def test_a_tracker_still_failing_at_the_end_says_how_to_send_the_rest(tmp_path, capsys):
    from evolve.cli.commands import main

    log = tmp_path / "sent.jsonl"
    obs = Messages()
    evolve.run(
        toy(budget={"generations": 1}, track=[{"name": RECORDER, "params": {"log": str(log), "fail_first": 99}}]),
        out=tmp_path / "run",
        observer=obs,
    )
    (end,) = obs.about("could not send everything")
    assert f"evolve track {tmp_path / 'run'} --to {RECORDER}" in end
    assert not [x for x in Recorder.read(log) if x["event"] == "generation"]
    main(["track", str(tmp_path / "run"), "--to", RECORDER, "--param", "fail_first=0"])  # the task file's log
    assert "2 generations" in capsys.readouterr().out
    assert [x["index"] for x in Recorder.read(log) if x["event"] == "generation"] == [0, 1]


def test_a_hanging_tracker_does_not_hold_the_run(tmp_path, monkeypatch):
    import time

    from evolve.trackers import live

    monkeypatch.setattr(live, "WAIT", 1.0)
    log = tmp_path / "sent.jsonl"
    obs = Messages()
    RELEASE.clear()
    try:
        t0 = time.time()
        report = evolve.run(
            toy(budget={"generations": 1}, track=[{"name": RECORDER, "params": {"log": str(log), "hang": True}}]),
            out=tmp_path / "run",
            observer=obs,
        )
        assert time.time() - t0 < 30 and report["best"]["test"]["score"] is not None
        (still,) = obs.about("still sending")
        assert f"evolve track {tmp_path / 'run'} --to {RECORDER}" in still
    finally:
        RELEASE.set()


def test_a_run_resumed_with_a_tracker_it_did_not_have_sends_what_it_missed(tmp_path):
    log = tmp_path / "sent.jsonl"
    evolve.run(toy(budget={"generations": 2}), out=tmp_path / "run")
    evolve.run(toy(track=[{"name": RECORDER, "params": {"log": str(log)}}]), out=tmp_path / "run", resume=True)
    assert [x["index"] for x in Recorder.read(log) if x["event"] == "generation"] == [0, 1, 2, 3, 4]
    # and a resume may drop it again: where a run reports is not part of what it computes
    evolve.run(toy(budget={"generations": 5}), out=tmp_path / "run", resume=True)


def test_evolve_track_without_to_uses_the_run_task_files_trackers_or_says_to_name_one(tmp_path, capsys):
    from evolve.cli.commands import main

    log = tmp_path / "sent.jsonl"
    evolve.run(
        toy(budget={"generations": 0}, track=[{"name": RECORDER, "params": {"log": str(log)}}]), out=tmp_path / "run"
    )
    main(["track", str(tmp_path / "run")])
    assert "0 generations" in capsys.readouterr().out  # all sent already, live
    evolve.run(toy(budget={"generations": 0}), out=tmp_path / "plain")
    with pytest.raises(SystemExit) as e:
        main(["track", str(tmp_path / "plain")])
    assert e.value.code == 2 and "names no tracker" in capsys.readouterr().err
