"""The dashboard in a real browser (headless Chromium, driven by Playwright): a finished SQL-world
run's lineage, a system's diff and scores, a recorded tool call, the per-task matrix against the
archive, a run in progress growing without a reload, and text that looks like a script shown as
text. Screenshots go to test-artifacts/ui/ (EVOLVE_TEST_ARTIFACTS)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("playwright")
pytest.importorskip("starlette")

import evolve  # noqa: E402
from evolve.archive import Archive  # noqa: E402
from evolve.types import LLMCall, Message, Reward, System, ToolCall, Trajectory  # noqa: E402
from evolve.ui import serve  # noqa: E402
from tests.helpers import sql_scripted, stored_rollouts  # noqa: E402
from tests.helpers.browser import artifacts, launch  # noqa: E402
from tests.helpers.ui_runs import layered_run  # noqa: E402

EVIL = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
SCRIPTED = {"backend": "scripted", "name": "toy", "params": {"reply": "evolve.worlds.toy:reply"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uibrowser")
    evolve.run(sql_scripted.task(budget={"generations": 4}), out=root / "sql")
    # a run whose texts try to run script: a prompt, a tool call's arguments and result, an output
    evil = System(prompts={"instruction": EVIL})
    with Archive(root / "evil") as a:
        a.add_system(System(prompts={"instruction": "plain"}))
        a.add_system(
            evil, parents=[System(prompts={"instruction": "plain"}).id], operator="mutate", rationale=EVIL, generation=1
        )
        steps = (
            LLMCall(role="policy", model="m", messages=(Message(role="user", content=EVIL),), output=EVIL),
            ToolCall(name="execute_sql", args={"sql": EVIL}, result=[[EVIL]]),
        )
        a.add_trajectories(
            [
                (
                    "k",
                    "val",
                    "eval",
                    1,
                    Trajectory(
                        task_id="t1",
                        system_id=evil.id,
                        steps=steps,
                        output=EVIL,
                        reward=Reward(score=0.0, feedback=EVIL),
                    ),
                )
            ]
        )
        a.put_state("baseline", System(prompts={"instruction": "plain"}).id)
        a.set_current(evil.id)
    layered_run(root)  # root/layers: memory, tools, a workflow graph
    return root


@pytest.fixture(scope="module")
def page(runs):
    from playwright.sync_api import sync_playwright

    with serve([runs]) as server, sync_playwright() as p:
        browser = launch(p)
        pg = browser.new_page(viewport={"width": 1400, "height": 900})
        pg.errors = []
        pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.base = server.base
        yield pg
        browser.close()


def stored(run: Path, seq: int) -> Trajectory:
    with sqlite3.connect(f"file:{run / 'archive.sqlite'}?mode=ro", uri=True) as db:
        ((key,),) = db.execute("SELECT key FROM trajectories WHERE seq = ?", (seq,)).fetchall()
    with Archive(run, create=False) as a:
        return a.get_trajectories([key])[key]


def visit(pg, hash_: str) -> None:
    pg.goto("about:blank")  # a fresh document each time: a hash change alone would keep the last drawing's marker
    pg.goto(f"{pg.base}/{hash_}")
    pg.wait_for_selector("body[data-drawn]", state="attached")  # (no wait_for_function: the page's CSP forbids eval)


def shot(pg, name: str) -> None:
    pg.screenshot(path=str(artifacts() / f"{name}.png"), full_page=True)


def test_the_lineage_renders_every_system_and_a_click_shows_its_diff_and_scores(page, runs):
    with Archive(runs / "sql", create=False) as a:
        records = a.records()
        best = a.get_state("best")
        parent = a.record(best).parents[0]
        before, after = a.get_system(parent).prompts["instruction"], a.get_system(best).prompts["instruction"]
        val = a.score(best, "val")
        accepted = {x["system_id"] for x in a.get_state("accepted")}
    visit(page, "#/run/sql/lineage?sys=baseline")
    page.wait_for_selector("svg#lineage g.node")
    assert page.locator("svg#lineage g.node").count() == len(records)
    want = {
        r.id: "baseline" if r.operator == "init" else "accepted" if r.id in accepted else "rejected" for r in records
    }
    drawn = {
        g.get_attribute("data-id"): g.get_attribute("data-state") for g in page.locator("svg#lineage g.node").all()
    }
    assert drawn == want  # every system finished: none drawn as undecided, only the starting one as the baseline
    page.locator(f'svg#lineage g.node[data-id="{best}"]').click()
    panel = page.locator(f'#system-panel [data-system="{best}"]')
    panel.wait_for()
    assert panel.locator(".diff td.path").all_inner_texts() == ["prompts.instruction"]
    assert before in panel.locator(".diff .before").inner_text() and after in panel.locator(".diff .after").inner_text()
    assert f"(n={val[1]})" in panel.locator("table.scores").inner_text()
    assert panel.locator("p.decision").inner_text().startswith("accepted:")
    shot(page, "lineage-sql")
    assert not page.errors


def test_the_trajectory_viewer_shows_a_recorded_tool_call(page, runs):
    visit(page, "#/run/sql/lineage?sys=baseline")
    page.locator("#system-panel table.rollouts tbody tr").first.click()
    page.wait_for_selector("#trajectory")
    seq = int(page.locator("#trajectory").get_attribute("data-seq"))
    calls = [s for s in stored(runs / "sql", seq).steps if isinstance(s, ToolCall)]
    tool = page.locator(".step.tool").first
    assert tool.get_attribute("data-tool") == calls[0].name == "execute_sql"
    assert calls[0].args["sql"] in tool.locator("pre.args").inner_text()
    shot(page, "trajectory-sql")
    # a rewrite after an error: the error and the second call are both shown
    with sqlite3.connect(f"file:{runs / 'sql' / 'archive.sqlite'}?mode=ro", uri=True) as db:
        ((seq2,),) = db.execute("SELECT seq FROM trajectories WHERE calls > 1 ORDER BY seq LIMIT 1").fetchall()
    visit(page, f"#/run/sql/rollout/{seq2}")
    assert page.locator(".step.tool").count() == 2
    assert page.locator("pre.tool-error").first.inner_text() == stored(runs / "sql", seq2).steps[1].error
    shot(page, "trajectory-sql-rewrite")
    assert not page.errors


def test_the_task_matrix_counts_match_the_archive(page, runs):
    visit(page, "#/run/sql/tasks")
    page.wait_for_selector("#matrix tbody tr")
    rows = page.locator("#matrix tbody tr")
    with Archive(runs / "sql", create=False) as a:
        accepted = [x["system_id"] for x in a.get_state("accepted")]
        assert rows.count() == len(accepted)
        for i, sid in enumerate(accepted[1:], start=1):
            parent = a.record(sid).parents[0]
            p, c = a.task_scores(parent, "val"), a.task_scores(sid, "val")
            fixed, broke = sum(c[t] > p[t] for t in p), sum(c[t] < p[t] for t in p)
            assert rows.nth(i).get_attribute("data-system") == sid
            assert (int(rows.nth(i).get_attribute("data-fixed")), int(rows.nth(i).get_attribute("data-broke"))) == (
                fixed,
                broke,
            )
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert (cells[6], cells[7]) == (str(fixed), str(broke))  # what the reader sees
    shot(page, "tasks-sql")
    visit(page, "#/run/sql")
    page.wait_for_selector("#plot-scores .main-svg")  # Plotly drew the curves
    shot(page, "overview-sql")
    assert not page.errors


def test_a_systems_memory_tools_and_workflow_graph(page):
    visit(page, "#/run/layers/lineage?sys=current")
    page.wait_for_selector("#system-panel [data-layer=memory]")
    page.click("#system-panel [data-layer=memory]")
    page.wait_for_selector("#memory table")
    assert "join on the _id column" in page.locator("#memory").inner_text()
    assert page.locator("#memory .badge", has_text="superseded").count() == 1
    page.click("#system-panel [data-layer=tools]")
    page.wait_for_selector("#tools")
    assert "count_where(db, t, c, v)" in page.locator("#tools").inner_text()
    assert page.locator("#tools .badge", has_text="rejected").count() == 1
    page.click("#system-panel [data-layer=workflow]")
    page.wait_for_selector("svg.workflow")
    assert sorted(page.locator("svg.workflow g.wf-node").evaluate_all("gs => gs.map(g => g.dataset.id)")) == [
        "answer",
        "fix",
        "run",
        "write",
    ]
    page.locator("#layer").screenshot(path=str(artifacts() / "workflow-graph.png"))
    assert not page.errors


def test_two_runs_compare_side_by_side(page):
    visit(page, "#/")
    page.wait_for_selector("#runs tbody tr")
    page.check('input[data-pick="sql"]')
    page.check('input[data-pick="layers"]')
    page.click("#compare-runs")
    page.wait_for_selector("table#compare-runs")
    head = page.locator("table#compare-runs thead").inner_text()
    assert "sql" in head and "layers" in head
    rows = {r.split("\t")[0]: r.split("\t")[1:] for r in page.locator("table#compare-runs tbody tr").all_inner_texts()}
    assert rows["generations"] == ["4", "–"]  # the layers run was written by hand: no generation yet, not "-1"
    assert rows["task"][0].endswith("seed 0") and "seed" not in rows["task"][1]  # no "seed null"
    page.wait_for_selector("#plot-compare .main-svg")
    shot(page, "compare-runs")
    assert not page.errors


def test_text_that_looks_like_a_script_is_shown_and_never_run(page):
    visit(page, "#/run/evil/lineage?sys=current")
    page.wait_for_selector("#system-panel h2")
    assert EVIL in page.locator("#system-panel").inner_text()  # the prompt and the rationale, as text
    visit(page, "#/run/evil/rollout/1")
    page.wait_for_selector("#trajectory")
    text = page.locator("#trajectory").inner_text()
    assert text.count(EVIL) >= 4  # message, output, tool arguments' and result's text, feedback
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#view img").count() == 0 and page.locator("#view script").count() == 0
    shot(page, "script-as-text")
    assert not page.errors


def test_a_live_runs_new_generation_appears_without_a_reload(page, runs):
    live = runs / "live"
    task = {
        "name": "live",
        "world": "toy",
        "seed": 0,
        "prompts": {"instruction": "multiply"},
        "models": {"policy": {**SCRIPTED, "params": {**SCRIPTED["params"], "delay": 0.05}}},
        "operators": [
            {
                "name": "scripted",
                "params": {
                    "component": "instruction",  # a new child every generation
                    "choices": [f"add, take {i}" for i in range(60)],
                },
            }
        ],
        "runner": {"name": "thread", "workers": 1, "timeout": 10},
        "budget": {"generations": 60},
        "engine": {"minibatch": 12},
    }
    (runs / "live.yaml").write_text(json.dumps(task))
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolve", "run", str(runs / "live.yaml"), "--out", str(live)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while stored_rollouts(live) < 30 and time.monotonic() < deadline:
            time.sleep(0.2)
        visit(page, "#/")
        page.wait_for_selector('#runs tr[data-run="live"]')  # a run started after the page: it appears
        visit(page, "#/run/live/lineage")
        page.wait_for_selector("svg#lineage g.node")
        page.evaluate("window.__same_page = true")
        first = page.locator("svg#lineage g.node").count()
        shot(page, "live-before")
        deadline = time.monotonic() + 90
        while page.locator("svg#lineage g.node").count() <= first and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert page.locator("svg#lineage g.node").count() > first
        states = page.locator("svg#lineage g.node").evaluate_all("gs => gs.map(g => g.dataset.state)")
        assert states.count("baseline") == 1  # a system still being evaluated is not drawn as the baseline
        assert page.evaluate("window.__same_page") is True  # redrawn in place, not reloaded
        assert "live" in page.locator("#live").inner_text()
        shot(page, "live-after")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not page.errors
