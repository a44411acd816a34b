"""The curriculum in the dashboard: each generation's levels, shares and the success counts that
decided them, answered as the run state holds them and drawn beside the run's curve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.scoring.state import RunState  # noqa: E402
from evolve.ui.app import Sources, build_app  # noqa: E402

SOLVES = {"sums": 1, "words": 9}  # the hardest level of each group the agent solves


def agent(task, ctx):
    return "right" if task["level"] <= SOLVES[task["generator"]] else "wrong"


def reward(task, output):
    return float(output == "right")


def curriculum_run(d: Path) -> Path:
    """Two groups of three levels: sums solved up to level 1 (up, up, then down from 2), words at every
    level (up, up, then mastered at the hardest)."""
    d.mkdir(parents=True, exist_ok=True)
    train = [
        {"id": f"{g}-{lv}-{i}", "generator": g, "level": lv, "x": i}
        for g in SOLVES
        for lv in range(3)
        for i in range(12)
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train))
    (d / "val.jsonl").write_text(
        "".join(json.dumps({"id": f"v{i}", "generator": "sums", "level": 0}) + "\n" for i in range(4))
    )
    task = {
        "name": "levels",
        "seed": 0,
        "agent": agent,
        "reward": reward,
        "models": {"policy": {"backend": "scripted", "name": "s"}},
        "prompts": {"instruction": "a"},
        "dataset": {"train": str(d / "train.jsonl"), "val": str(d / "val.jsonl")},
        "operators": [{"name": "scripted", "params": {"component": "instruction", "choices": ["b", "c", "d"]}}],
        "engine": {"minibatch": 12, "curriculum": {"min_samples": 4}},
        "budget": {"generations": 4},
        "runner": {"name": "thread", "workers": 2},
    }
    evolve.run(task, out=d / "run")
    return d / "run"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return curriculum_run(tmp_path_factory.mktemp("uicur"))


def test_the_summary_holds_each_generations_levels_shares_and_the_counts_that_decided_them(run):
    got = TestClient(build_app(Sources([run]), hosts=["testserver"])).get("/api/runs/run/summary").json()
    cur = got["curriculum"]
    with Archive(run, create=False, read_only=True) as a:
        decisions = RunState(a).curricula()
    assert [r["generation"] for r in cur["generations"]] == [d["generation"] for d in decisions] == [1, 2, 3, 4]
    for row, d in zip(cur["generations"], decisions):
        assert {k: row[k] for k in ("levels", "mix", "moves", "success", "band")} == {
            k: d[k] for k in ("levels", "mix", "moves", "success", "band")
        }
        assert row["minibatch"] == len(d["minibatch"]) and "parents" not in row
    moves = [r["moves"] for r in cur["generations"]]
    assert [m["sums"] for m in moves] == ["start", "up", "up", "down"]
    assert [m["words"] for m in moves] == ["start", "up", "up", "mastered"]
    last = cur["generations"][-1]
    assert last["levels"] == {"sums": 1, "words": 2}
    assert last["success"]["sums"]["level"] == 2 and last["success"]["sums"]["solved"] == 0
    s = last["success"]["words"]
    assert s["level"] == 2 and s["solved"] == s["n"] >= 4
    assert last["mix"]["sums"] == pytest.approx(0.8)  # words mastered: a quarter of its weight
    assert cur["settings"]["min_samples"] == 4 and cur["settings"]["evidence"] == "minibatch"  # as the run had them
    report = json.loads((run / "report.json").read_text())
    assert report["curriculum"]["generations"] == cur["generations"]  # what the report shows, the same rows


def test_a_run_without_a_curriculum_has_none(tmp_path):
    from tests.helpers.ui_runs import big_archive

    r, _ = big_archive(tmp_path / "plain", accepted=2, rejected_each=0)
    got = TestClient(build_app(Sources([r]), hosts=["testserver"])).get("/api/runs/plain/summary").json()
    assert got["curriculum"] is None


def test_the_overview_draws_the_curriculum_beside_the_curve(run):
    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    from evolve.ui import serve
    from tests.helpers.browser import launch

    with serve([run]) as server, sync_playwright() as p:
        browser = launch(p)
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(f"{server.base}/#/run/run/overview")
        pg.wait_for_selector("#curriculum-table tbody tr[data-generation='4']")
        cells = pg.locator("#curriculum-table tbody tr[data-generation='4'] td").all_inner_texts()
        assert cells[1].startswith("L1 80%") and "(down; 0/" in cells[1] and "solved at L2)" in cells[1]
        assert cells[2].startswith("L2 20%") and "(mastered;" in cells[2]
        pg.wait_for_selector("#plot-curriculum-levels .main-svg")
        pg.wait_for_selector("#plot-scores .main-svg")
        assert pg.locator("#plot-curriculum-levels .legendtext").all_text_contents() == ["sums", "words"]
        browser.close()
    assert errors == []
