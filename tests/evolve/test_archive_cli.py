"""``evolve archive`` commands, run with typer's CliRunner on a small archive."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive, load_export
from evolve.cli.archive import app
from evolve.types import ModelSpec, Reward, System, Trajectory

LONG = "You answer questions about the database.\nAlways check the schema first.\nBe brief."


@pytest.fixture
def run(tmp_path) -> dict:
    """An archive with a baseline, two children (one with an adapter artifact) and scores."""
    run_dir = tmp_path / "run"
    with Archive(run_dir) as a:
        adapter = a.artifacts.put_bytes(b"adapter-bytes", "adapter")
        base = System(models={"policy": ModelSpec(backend="scripted", name="x")}, prompts={"instruction": LONG})
        better = base.replace(prompts={"instruction": LONG.replace("Be brief.", "Be brief and cite the table names.")})
        tuned = better.replace(models={"policy": ModelSpec(backend="scripted", name="x", adapter=adapter)})
        i0 = a.add_system(base)
        i1 = a.add_system(better, parents=[i0], operator="reflect", rationale="cite tables", generation=1)
        i2 = a.add_system(tuned, parents=[i1], operator="sft", generation=2, info={"kept": 12})
        rows = []
        for sid, val, test in ((i0, 0.25, 0.2), (i1, 0.75, 0.7), (i2, 0.5, None)):
            for t in range(4):
                rows.append(
                    (
                        f"{sid}-v{t}",
                        "val",
                        "eval",
                        0,
                        Trajectory(
                            task_id=f"task{t}",
                            system_id=sid,
                            output="x",
                            reward=Reward(score=val, feedback=f"feedback for task{t} [red]not markup[/red]"),
                        ),
                    )
                )
                if test is not None:
                    rows.append(
                        (
                            f"{sid}-t{t}",
                            "test",
                            "eval",
                            0,
                            Trajectory(task_id=f"task{t}", system_id=sid, reward=Reward(score=test)),
                        )
                    )
        rows.append(
            (f"{i2}-crash", "val", "rollout", 2, Trajectory(task_id="task9", system_id=i2, error="agent timed out"))
        )
        a.add_trajectories(rows)
        a.set_current(i0, "init")
        a.set_current(i2)
    return {"dir": run_dir, "ids": (i0, i1, i2), "adapter": adapter}


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_list(run):
    i0, i1, i2 = run["ids"]
    r = invoke("list", run["dir"])
    assert r.exit_code == 0, r.output
    out = r.stdout
    for sid in (i0, i1, i2):
        assert sid[:12] in out
    assert "0.750 (4)" in out and "0.700 (4)" in out and "test (n)" in out
    line2 = next(line for line in out.splitlines() if i2[:12] in line)
    assert "*" in line2 and "sft" in line2 and i1[:12] in line2
    assert "*" not in next(line for line in out.splitlines() if i0[:12] in line)
    r = invoke("list", run["dir"], "--last", "1")
    assert i2[:12] in r.stdout and i0[:12] not in r.stdout


def test_show(run):
    i0, i1, i2 = run["ids"]
    r = invoke("show", run["dir"], i1[:6])
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert i1 in out and "reflect" in out and "cite tables" in out
    assert f"{i1[:12]} <- {i0[:12]}" in out
    assert "0.750" in out and "0.700" in out
    assert '"instruction"' in out and "Be brief and cite" in out
    assert "task0" in out and "[red]not markup[/red]" in out  # user text is not parsed as markup
    assert sum("/eval" in line for line in out.splitlines()) == 3 and "example trajectories (3)" in out
    r = invoke("show", run["dir"], "current", "--trajectories", "10")
    assert r.exit_code == 0, r.output
    assert "(current)" in r.stdout and "agent timed out" in r.stdout and '"kept": 12' in r.stdout
    r = invoke("show", run["dir"], "best", "-t", "0")
    assert r.exit_code == 0 and i1 in r.stdout and "example trajectories" not in r.stdout
    r = invoke("show", run["dir"], "baseline")
    assert r.exit_code == 0 and i0 in r.stdout


def test_diff(run):
    i0, i1, i2 = run["ids"]
    r = invoke("diff", run["dir"], "baseline", i1)
    assert r.exit_code == 0, r.output
    assert "prompts.instruction" in r.stdout
    assert "-Be brief." in r.stdout and "+Be brief and cite the table names." in r.stdout
    r = invoke("diff", run["dir"], i1, i2)
    assert r.exit_code == 0, r.output
    assert "models.policy.adapter" in r.stdout and run["adapter"].sha256[:12] in r.stdout
    r = invoke("diff", run["dir"], i1, i1[:8])
    assert r.exit_code == 0 and "identical" in r.stdout


def test_rollback(run):
    i0, i1, i2 = run["ids"]
    r = invoke("rollback", run["dir"], i1[:7])
    assert r.exit_code == 0, r.output
    assert f"{i2} -> {i1}" in r.stdout
    with Archive(run["dir"], create=False) as a:
        assert a.current() == i1
        assert [x[1] for x in a.pointer_history()] == ["init", "promote", "rollback"]
        assert len(a.records()) == 3


def test_export(run, tmp_path):
    i0, i1, i2 = run["ids"]
    dest = tmp_path / "exported"
    r = invoke("export", run["dir"], "current", "--to", dest)
    assert r.exit_code == 0, r.output
    assert "1 artifact" in r.stdout
    system, store = load_export(dest)
    assert system.id == i2
    assert store.path(run["adapter"]).read_bytes() == b"adapter-bytes"
    assert json.loads((dest / "system.json").read_text())["lineage"] == [i2, i1, i0]
    r = invoke("export", run["dir"], "current", "--to", dest)
    assert r.exit_code == 2 and "refusing to overwrite" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (("list", "{tmp}/nowhere"), "not an evolvekit run directory"),
        (("show", "{run}", "ffffffffff"), "no system 'ffffffffff'"),
        (("show", "{run}", ""), "empty system id"),
        (("diff", "{run}", "baseline", "zz"), "no system 'zz'"),
        (("rollback", "{run}", "nope"), "no system 'nope'"),
        (("export", "{tmp}/nowhere", "best", "--to", "{tmp}/x"), "not an evolvekit run directory"),
    ],
)
def test_user_errors_exit_2(run, tmp_path, args, message):
    args = [a.format(tmp=tmp_path, run=run["dir"]) for a in args]
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nowhere").exists()


def test_ambiguous_prefix(tmp_path):
    with Archive(tmp_path / "r") as a:
        ids = [a.add_system(System(prompts={"i": str(i)})) for i in range(40)]
    first = [i[0] for i in ids]
    shared = next(c for c in first if first.count(c) > 1)
    r = invoke("show", tmp_path / "r", shared)
    assert r.exit_code == 2 and "ambiguous" in r.stderr


def test_no_current_and_no_scores(tmp_path):
    with Archive(tmp_path / "r") as a:
        a.add_system(System(prompts={"i": "x"}))
    r = invoke("list", tmp_path / "r")
    assert r.exit_code == 0 and "no current system yet" in r.stdout and "test (n)" not in r.stdout
    r = invoke("show", tmp_path / "r", "best")
    assert r.exit_code == 2 and "val score" in r.stderr
    r = invoke("rollback", tmp_path / "r", "current")
    assert r.exit_code == 2 and "no current system" in r.stderr


def test_help():
    r = invoke("--help")
    assert r.exit_code == 0
    for cmd in ("list", "show", "diff", "rollback", "export"):
        assert cmd in r.stdout
