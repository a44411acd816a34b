"""The SQL world end to end with a real (tiny, briefly trained) local model: cold start, STaR,
adapters archived and reloaded, the SFT cache reused. Plumbing only: accuracy is measured by
the quickstart, not here."""

import json

import pytest
import yaml

import evolve
from evolve.archive import Archive
from evolve.policy.weights import BASE_FORMAT, _read, _write, read_base_meta
from tests.helpers import TESTS

pytestmark = pytest.mark.slow


def small_task() -> dict:
    data = yaml.safe_load((TESTS.parent / "examples" / "sql_agent" / "task.yaml").read_text())
    data["dataset"]["params"] = {"n_train": 120, "n_val": 16, "n_test": 16}
    data["models"]["policy"]["cold_start"].update(
        n_demos=24, epochs=2, eval_every=4, n_eval=8, tiny={"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
    )
    # threshold 0: every sample counts as a success, so an adapter is trained whatever the accuracy
    data["operators"] = [
        {
            "name": "star",
            "params": {"tasks": 12, "samples": 2, "threshold": 0.0, "turns": "all", "epochs": 1, "min_examples": 1},
        }
    ]
    data["budget"] = {"generations": 1}
    data["engine"] = {"minibatch": 8, "min_gain": -1.0, "val_tolerance": 1.0}  # accept the child: plumbing
    data["runner"] = {"name": "thread", "workers": 16, "timeout": 60}
    return data


def test_cold_start_star_adapter_archive_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    report = evolve.run(small_task(), out=tmp_path / "run")
    assert report["best"]["test"]["n"] == 16 and report["baseline"]["val"]["n"] == 16
    a = Archive(tmp_path / "run", create=False)
    (rec,) = [r for r in a.records() if r.operator == "star"]
    child = a.get_system(rec.id)
    assert rec.parents == (report["baseline"]["system_id"],) or list(rec.parents) == [report["baseline"]["system_id"]]
    base = a.get_system(report["baseline"]["system_id"])
    spec = child.models["policy"]
    assert spec.adapter is not None and spec.base == base.models["policy"].base  # parent base + new adapter
    assert a.artifacts.path(spec.adapter).exists()
    trajs = a.trajectories(system_id=base.id, phase="star")
    assert trajs and all(t.steps[0].token_ids for t in trajs)  # sampler token ids are recorded
    a.close()
    app = evolve.load(tmp_path / "run", child.id)
    assert app.system.models["policy"].adapter == spec.adapter
    traj = app.rollout(_a_test_task(tmp_path))
    assert traj.steps and traj.error is None
    app.close()
    # the base file holds no wall time (it would rename the same weights on every machine); info.json does
    (entry,) = (tmp_path / "cache" / "sft").iterdir()
    assert "seconds" not in read_base_meta(entry / "base.safetensors")["info"]
    assert json.loads((entry / "info.json").read_text())["seconds"] > 0
    # a cache written before that fix (wall time in the file) is rewritten on reuse: the same base id
    tensors, meta = _read(entry / "base.safetensors", BASE_FORMAT)
    _write(tensors, {**meta, "info": {**meta["info"], "seconds": 123.4}}, entry / "base.safetensors")
    # the cold start is cached: a second run reuses the same base weights
    report2 = evolve.run(small_task(), out=tmp_path / "run2")
    assert report2["baseline"]["system_id"] == report["baseline"]["system_id"]
    assert len(list((tmp_path / "cache" / "sft").iterdir())) == 1
    assert json.loads((tmp_path / "run" / "report.json").read_text())["best"] == report["best"]
    assert evolve.load(tmp_path / "run", "baseline").system.models["policy"].adapter is None
    _rescored_on_more_tasks(tmp_path, child)


def _rescored_on_more_tasks(tmp_path, child):
    """evolve.results.rescore on systems with artifacts (base weights, an adapter): they are copied into
    the scoring's own store, and the run's test tasks, the first of the larger split, score as in the run."""
    from evolve.results import rescore

    task = tmp_path / "small.yaml"
    task.write_text(yaml.safe_dump(small_task()))
    out = tmp_path / "rescore"
    run = tmp_path / "run"
    rows = rescore.main(
        [
            "--task",
            str(task),
            "--seed",
            "0",
            "--n-test",
            "32",
            "--out",
            str(out),
            f"sft={run}:baseline",
            f"star={run}:op:star",
        ]
    )["rows"]
    assert [r["n"] for r in rows] == [32, 32] and rows[1]["system"] == child.id
    d = rows[1]["vs_first"]
    assert abs(d["diff"] - (rows[1]["accuracy"] - rows[0]["accuracy"])) < 1e-9
    spec = child.models["policy"]
    scoring = Archive(out, create=False)
    assert scoring.artifacts.path(spec.adapter).exists() and scoring.artifacts.path(spec.base).exists()
    src = Archive(run, create=False)
    scored = [
        {str(t.task_id): t.score for t in scoring.trajectories(system_id=r["system"], split="test")} for r in rows
    ]
    assert [len(s) for s in scored] == [32, 32]
    # the run scored its baseline on test (its 16 tasks are the first of the 32): the same scores again
    mine = {str(t.task_id): t.score for t in src.trajectories(system_id=rows[0]["system"], split="test")}
    assert len(mine) == 16 and {k: scored[0][k] for k in mine} == mine


def _a_test_task(tmp_path):
    from evolve.worlds.sql import dataset

    return dataset(seed=0, n_train=120, n_val=16, n_test=16)["test"][0]


def test_pointer_words_make_every_schema_name_a_pointer_and_a_new_cache_entry(tmp_path, monkeypatch):
    from evolve.policy.weights import load_base
    from evolve.worlds.sql import dataset, name_words

    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    task = small_task()
    task["budget"] = {"generations": 0}
    task["models"]["policy"]["cold_start"]["keep_share"] = 0.02  # small demo set: frequent names are kept
    task["models"]["policy"]["cold_start"].pop("pointer_words")  # task.yaml sets it: first the world without
    evolve.run(task, out=tmp_path / "plain")
    task["models"]["policy"]["cold_start"]["pointer_words"] = "evolve.worlds.sql:name_words"
    evolve.run(task, out=tmp_path / "ptr")
    bases = sorted((tmp_path / "cache" / "sft").glob("*/base.safetensors"))
    assert len(bases) == 2  # the option is part of the cache key
    names = name_words(dataset(seed=0, n_train=120, n_val=16, n_test=16)["train"])
    keeps = [load_base(b)[1].keep & names for b in bases]
    assert sorted(bool(k) for k in keeps) == [False, True]  # without the option some names are spelled


def test_how_the_model_is_served_does_not_retrain_the_cold_start(tmp_path, monkeypatch):
    """The engine and its batching are not part of what a cold start trains: changing them reuses the
    cached weights (issue 62: a new engine used to retrain the SFT)."""
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    task = small_task()
    task["budget"] = {"generations": 0}
    evolve.run(task, out=tmp_path / "a")
    task["models"]["policy"].setdefault("params", {}).update(engine="torch", max_batch=4, batch_wait_ms=1)
    evolve.run(task, out=tmp_path / "b")
    assert len(list((tmp_path / "cache" / "sft").glob("*/base.safetensors"))) == 1
    task["models"]["policy"]["params"]["max_tokens"] = 7  # what validation generates is part of it
    evolve.run(task, out=tmp_path / "c")
    assert len(list((tmp_path / "cache" / "sft").glob("*/base.safetensors"))) == 2
