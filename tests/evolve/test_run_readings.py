"""The numbers a user reads about runs: two runs pair only the tasks they share (the same id and
the same content), a finished run stays finished whatever a promotion or a rollback writes later,
and the dashboard reads a run without leaving a file in its folder. Real toy-world runs (seed 0
twice, seed 1: the same task ids, other numbers to add)."""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.mcp import views  # noqa: E402
from evolve.ui.app import Sources, build_app  # noqa: E402
from tests.helpers import DATA  # noqa: E402
from tests.helpers.ui_runs import big_archive  # noqa: E402

JS = Path(evolve.__file__).parent / "ui" / "static" / "js"


def client(*paths: Path) -> TestClient:
    return TestClient(build_app(Sources(list(paths)), hosts=["testserver"]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("readings")
    for name, seed in (("s0", 0), ("again", 0), ("s1", 1)):
        evolve.run(DATA / "toy.yaml", out=root / name, overrides=["budget.generations=2", f"seed={seed}"])
    gc.collect()  # the runs' own archives (kept open for reading) closed, as when `evolve run` exits
    assert not list(root.glob("*/archive.sqlite-*"))
    return root


def _forget(run: Path, key: str) -> None:
    """What an older evolvekit's run lacks (a run-state key), removed by hand."""
    with sqlite3.connect(run / "archive.sqlite") as c:
        c.execute("DELETE FROM state WHERE key = ?", (key,))


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_runs_of_two_seeds_pair_no_task_though_their_ids_agree(runs):
    with Archive(runs / "s0", read_only=True) as a, Archive(runs / "s1", read_only=True) as b:
        ids = set(a.task_scores(a.current(), "test")) & set(b.task_scores(b.current(), "test"))
    assert len(ids) == 20  # test-0 ... test-19 in both: other sums to do
    c = client(runs).get("/api/compare?a=s0:best&b=s1:best").json()["tasks"]["test"]
    assert (c["n"], c["p"], c["ci95"], c["low"], c["diff"]) == (0, None, None, None, None)
    assert c["unpaired"] == 20 and "other content" in c["why"]
    m = views.compare(runs / "s0", "s0", "best", runs / "s1", "s1", "best")["tasks"]["test"]
    assert m["n"] == 0 and m["reading"].startswith("no task in common: 20 tasks with the same id hold other content")
    assert "p=" not in m["reading"]


def test_runs_of_one_seed_pair_every_task(runs):
    c = client(runs).get("/api/compare?a=s0:baseline&b=again:best").json()["tasks"]["test"]
    with Archive(runs / "s0", read_only=True) as a, Archive(runs / "again", read_only=True) as b:
        base, best = a.task_scores(a.get_state("baseline"), "test"), b.task_scores(b.get_state("best"), "test")
    assert c["n"] == 20 and c["unpaired"] == 0 and c["why"] is None
    assert c["diff"] == pytest.approx(sum(best.values()) / 20 - sum(base.values()) / 20)


def test_runs_an_older_evolvekit_made_pair_only_when_made_alike(runs, tmp_path):
    for name in ("s0", "again", "s1"):
        shutil.copytree(runs / name, tmp_path / name)
        _forget(tmp_path / name, "task_hashes")
    c = client(tmp_path)
    same = c.get("/api/compare?a=s0:best&b=again:baseline").json()["tasks"]["test"]
    assert same["n"] == 20 and same["p"] is not None  # the same dataset settings, seed and folder: the same tasks
    other = c.get("/api/compare?a=s0:best&b=s1:best").json()["tasks"]["test"]
    assert other["n"] == 0 and other["p"] is None and "older evolvekit" in other["why"]


def test_a_scores_interval_never_leaves_0_100(runs):
    s = client(runs).get("/api/runs/s0/summary").json()
    best, base = s["best"]["test"], s["baseline"]["test"]
    assert best["mean"] == 1.0 and best["n"] == 20  # every test task solved: "100.0% ±0.0" before
    assert 0.8 < best["low"] < 1.0 and best["high"] == 1.0 and "ci95" not in best
    assert 0.0 <= base["low"] < base["mean"] < base["high"] <= 1.0
    g = s["paired"]["test"]  # +95 points, whose normal interval reaches past +100
    assert g["diff"] + g["ci95"] > 1.0 and g["high"] == 1.0 and g["low"] == pytest.approx(g["diff"] - g["ci95"])
    assert "95% CI [+78.1, +100.0]" in (runs / "s0" / "report.md").read_text()


def test_the_dashboard_prints_an_asymmetric_interval_as_low_high():
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the page's formatting is checked with node")
    code = (
        "import { score, gain } from './dom.js';\n"
        "console.log(score({ mean: 1, n: 15, low: 0.7961, high: 1 }));\n"
        "console.log(gain({ diff: 0.95, ci95: 0.098, low: 0.852, high: 1, n: 20 }));\n"
        "console.log(gain({ diff: 0.1, ci95: 0.05, low: 0.05, high: 0.15, n: 300 }));\n"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", code], cwd=JS, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["100.0% [79.6, 100.0] (n=15)", "95.0 pts [85.2, 100.0]", "10.0 pts ±5.0"]


@pytest.mark.parametrize("older", [False, True])
def test_a_finished_run_rolled_back_stays_finished(runs, tmp_path, monkeypatch, older):
    import evolve.ui.run as ui_run
    from evolve.deploy.manage import rollback

    run = tmp_path / "run"
    shutil.copytree(runs / "s0", run)
    if older:  # a run made before runs said their own status: the report against the engine's writes
        _forget(run, "status")
    with Archive(run, create=False) as a:
        base = a.get_state("baseline")
    rollback(run, base, by="test", why="test")
    c = client(run)
    assert c.get("/api/runs").json()["runs"][0]["status"] == "finished"
    monkeypatch.setattr(ui_run, "ACTIVE_S", 0.0)  # long after: still finished, never stopped
    assert c.get("/api/runs").json()["runs"][0]["status"] == "finished"
    for job in (None, {"state": "stopped", "pid": 1, "exit_code": None, "started": 0, "ended": None, "attempts": 1}):
        st = views.status(run, "run", job, "")  # a job gone without a word after the run ended: finished too
        assert st["state"] == "finished" and "resume_run" not in st["next"]


def test_a_run_says_it_is_running_while_its_engine_works(tmp_path):
    seen = []

    class Look:  # an observer: what the dashboard reads while the run goes
        def __getattr__(self, name):
            return lambda *a, **k: None

        def phase(self, *a, **k):
            if (tmp_path / "r" / "archive.sqlite").exists() and not seen:
                with Archive(tmp_path / "r", create=False, read_only=True) as a:
                    seen.append(a.get_state("status"))

    evolve.run(DATA / "toy.yaml", out=tmp_path / "r", overrides=["budget.generations=1"], observer=Look())
    assert seen == ["running"]
    with Archive(tmp_path / "r", create=False) as a:
        assert a.get_state("status") == "finished"


ROUTES = (
    "/api/runs",
    "/api/runs/{rid}/summary",
    "/api/runs/{rid}/lineage?view=all",
    "/api/runs/{rid}/matrix",
    "/api/runs/{rid}/deploy",
    "/api/runs/{rid}/systems/best",
    "/api/runs/{rid}/systems/best/memory",
    "/api/runs/{rid}/systems/best/rollouts",
    "/api/runs/{rid}/rollouts/1",
    "/api/compare?a={rid}:baseline&b={rid}:best",
)


def _read_everything(c: TestClient, rid: str, rollouts: bool = True) -> None:
    for path in ROUTES if rollouts else [r for r in ROUTES if "rollouts/1" not in r]:
        assert c.get(path.format(rid=rid)).status_code == 200, path


def test_the_dashboard_leaves_nothing_in_a_run_folder(runs, tmp_path):
    finished = tmp_path / "finished"
    shutil.copytree(runs / "s0", finished)
    closed, _ = big_archive(tmp_path / "closed", accepted=3, rejected_each=2)  # written by hand, its writer closed
    for run in (finished, closed):
        before = _files(run)
        assert not [f for f in before if f.endswith(("-wal", "-shm"))]
        c = client(run)
        _read_everything(c, run.name, rollouts=run is finished)
        assert _files(run) == before


def test_the_dashboard_follows_a_run_that_is_written_again(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs / "s0", run)
    before = _files(run)
    assert not [f for f in before if f.endswith(("-wal", "-shm"))]
    c = client(run)
    first = c.get("/api/runs/run/summary").json()
    with Archive(run, create=False) as a:  # a writer comes back: the dashboard sees what it writes
        a.set_current(a.get_state("baseline"), "rollback")
        live = c.get("/api/runs/run/summary").json()
        assert live["current"] == a.get_state("baseline") != first["current"]
    assert c.get("/api/runs/run/summary").json()["current"] == live["current"]
    assert _files(run) == before  # the writer removed its own files; the dashboard made none
    # a live writer's files are read through, never made: the dashboard opened while the writer holds them
    with Archive(run, create=False) as a:
        a.put_state("note", 1)
        held = _files(run)
        assert any(f.endswith("-wal") for f in held)
        c2 = client(run)
        _read_everything(c2, "run")
        a.put_state("note", 2)
        assert c2.get("/api/runs/run/summary").status_code == 200 and _files(run) == held
    assert os.path.exists(run / "archive.sqlite")
