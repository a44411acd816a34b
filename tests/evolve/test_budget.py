"""Call budgets and the dry-run estimate, with a scripted agent that makes exactly one LLM call
per rollout and an operator whose every child passes both acceptance stages (tests/helpers/agents.py)."""

import json
import random
import sqlite3

import pytest
import yaml

import evolve
from evolve.archive import SCHEMA_VERSION, Archive
from evolve.errors import ConfigError
from evolve.registry import operators as operator_registry
from evolve.task.taskfile import validate_task
from evolve.types import LLMCall
from tests.evolve.test_archive import make_traj
from tests.helpers.agents import LevelUp, vote_search_task

operator_registry.register("level_up", LevelUp)


class Unestimated:
    """An operator without ``estimate()``, as a plugin may register one."""

    name = "unestimated"

    def propose(self, parent, ctx) -> list:
        return []


operator_registry.register("unestimated", Unestimated)


def level_task(**over) -> dict:
    task = {
        "name": "levels",
        "seed": 0,
        "agent": "tests.helpers.agents:level_agent",
        "reward": "tests.helpers.agents:level_reward",
        "models": {"policy": {"backend": "scripted", "name": "echo", "params": {"echo": True, "cost_per_call": 0.001}}},
        "prompts": {"level": "0"},
        "dataset": {"source": "tests.helpers.agents:level_dataset"},
        "operators": [{"name": "level_up", "params": {"children": 2, "explore": 3}}],
        "runner": {"name": "thread", "workers": 4, "timeout": 10},
        "budget": {"generations": 2},
        "engine": {"minibatch": 4, "parents": 2},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            task[section] = {**task[section], field: value}
        else:
            task[section] = value
    return task


def calls_outside_test(run_dir) -> int:
    with Archive(run_dir, create=False) as a:
        return sum(
            isinstance(step, LLMCall) for r in a.trajectory_rows() if r.split != "test" for step in r.trajectory.steps
        )


def test_dry_run_counts_exactly_what_the_run_then_spends(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = level_task(seed=1)
    est = evolve.dry_run(task)
    # the plan, by hand: baseline val 6; gen 1: 1 parent x (minibatch 4 + explore 3) + 2 children x (4 + val 6);
    # gen 2: pool of 3, so 2 parents x 7 + 4 children x 10; after the loop: baseline and promoted on test (2 x 5)
    assert [r["rollouts"] for r in est["phases"]] == [6, 27, 54]
    assert [(r["parents"], r["children"]) for r in est["phases"]] == [(0, 0), (1, 2), (2, 4)]
    assert est["in_budget"]["calls"] == 87 and est["final"]["calls"] == 10 and est["total"]["calls"] == 97
    assert est["total"]["usd"] == pytest.approx(0.097)
    assert est["stop"] is None and est["calls_per_rollout_source"] == "assumed 1"
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing run
    # the two minibatches share no task, so no parent's rollouts are memoised from the generation before
    train = [f"train-{i}" for i in range(30)]
    mb = [set(random.Random(f"1/minibatch/{g}").sample(train, 4)) for g in (1, 2)]  # the engine's draw, seed 1
    assert not mb[0] & mb[1]

    report = evolve.run(task, out=tmp_path / "run")
    assert report["stop_reason"] == "generations done"
    assert report["budget_used_by_run"]["calls"] == est["in_budget"]["calls"] == 87
    assert report["budget_used_by_run"]["rollouts"] == est["in_budget"]["rollouts"]
    assert report["budget_used"]["calls"] == est["total"]["calls"] == 97
    assert report["budget_used"]["cost"] == pytest.approx(est["total"]["usd"])
    assert calls_outside_test(tmp_path / "run") == 87
    assert [g["calls"] for g in report["generations"]] == [6, 27, 54]


def test_call_budget_stops_at_exactly_n_calls(tmp_path):
    report = evolve.run(level_task(budget={"generations": 5, "calls": 40}), out=tmp_path / "r")
    assert report["stop_reason"] == "call budget of 40 LLM calls spent (40 used)"
    assert report["budget_used_by_run"]["calls"] == 40 == calls_outside_test(tmp_path / "r")
    assert "test" in report["baseline"]  # the final test scoring still happens, outside the budget
    # the dry run says where it stops: after 40 rollouts, in generation 2 (6 + 27 = 33 before it)
    est = evolve.dry_run(level_task(budget={"generations": 5, "calls": 40}))
    assert est["stop"]["budget"] == "calls" and est["stop"]["phase"] == "gen 2" and est["stop"]["rollouts"] == 40
    assert len(report["generations"]) == 2  # generations 0 and 1 finished; 2 was cut
    # scoring afterwards (evolve eval) is outside the budget too
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(level_task(budget={"generations": 5, "calls": 40})))
    assert evolve.evaluate(tmp_path / "task.yaml", tmp_path / "r", system="baseline", split="train")[:2] == (0.0, 30)


def test_the_final_test_scoring_never_counts_against_a_resumed_runs_budget(tmp_path):
    # a finished run has scored its baseline on test; resumed with one more generation and a budget
    # that fits exactly the rollouts spent outside test plus that generation, it must run it in full
    first = evolve.run(level_task(budget={"generations": 1}), out=tmp_path / "r")
    spent = first["budget_used_by_run"]["calls"]
    assert first["budget_used"]["calls"] > spent  # test rollouts exist
    need = evolve.dry_run(level_task(budget={"generations": 2}))["in_budget"]["calls"]  # 6 + 27 + 54
    again = evolve.run(level_task(budget={"generations": 2, "calls": need}), out=tmp_path / "r", resume=True)
    assert again["stop_reason"] == "generations done", again["stop_reason"]
    assert need >= again["budget_used_by_run"]["calls"] == calls_outside_test(tmp_path / "r") > spent
    with Archive(tmp_path / "r", create=False) as a:  # the change of budget is on record
        assert [e["now"]["calls"] for e in a.events("budget")] == [need]
    # scoring a finished run with other --set budget values leaves its stored task alone
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(level_task(budget={"generations": 2, "calls": need})))
    evolve.evaluate(tmp_path / "task.yaml", tmp_path / "r", overrides=["budget.generations=7"], split="val")
    with Archive(tmp_path / "r", create=False) as a:
        assert len(a.events("budget")) == 1 and json.loads(a.get_state("task"))["budget"]["generations"] == 2


def test_call_budget_with_several_calls_per_rollout(tmp_path):
    # unset calls_per_rollout: the first batch assumes 1 call, later ones the most seen (2): never over by more
    # than the first batch's surprise, and here the first batch (6 rollouts, 12 calls) fits
    report = evolve.run(
        level_task(agent="tests.helpers.agents:level_agent_two_calls", budget={"generations": 3, "calls": 41}),
        out=tmp_path / "a",
    )
    assert "call budget of 41" in report["stop_reason"]
    assert report["budget_used_by_run"]["calls"] == 40
    # declared: only the rollouts that fit start, even in the first batch (5 calls: 2 rollouts)
    report = evolve.run(
        level_task(
            agent="tests.helpers.agents:level_agent_two_calls",
            budget={"generations": 1, "calls": 5, "calls_per_rollout": 2},
        ),
        out=tmp_path / "b",
    )
    assert report["budget_used_by_run"]["calls"] == 4 and "call budget of 5" in report["stop_reason"]


def test_dry_run_without_declared_estimates_reprices_and_caps(tmp_path):
    task = level_task(
        operators=[{"name": "scripted", "params": {"component": "level", "choices": ["1", "2", "3"], "children": 2}}],
        budget={"generations": 3, "usd": 0.05, "calls_per_rollout": 2},
        models={"policy": {"backend": "scripted", "name": "echo", "params": {"echo": True, "cost_per_call": 0.001}}},
    )
    est = evolve.dry_run(task)
    assert est["calls_per_rollout_source"] == "budget.calls_per_rollout"
    assert [r["calls"] for r in est["phases"]] == [2 * r["rollouts"] for r in est["phases"]]
    assert est["stop"]["budget"] == "usd" and est["stop"]["rollouts"] == 25  # $0.05 / (2 calls x $0.001)
    # an operator without estimate(): counted by its 'children', its own cost reported as unknown
    est = evolve.dry_run(level_task(operators=[{"name": "unestimated"}]))
    assert est["operators"][0]["declared"] is False and est["operators"][0]["children"] == 1
    assert any("without an estimate()" in n for n in est["notes"])


def test_dry_run_prices_litellm_models_from_the_local_cost_map():
    pytest.importorskip("litellm")
    task = level_task(
        models={"policy": {"backend": "litellm", "name": "openai/gpt-4o-mini", "params": {"max_tokens": 100}}},
        prompts={"level": "x" * 400},
    )
    est = evolve.dry_run(task)
    p = est["pricing"]
    assert (p["prompt_tokens"], p["completion_tokens"]) == (100, 100)
    import litellm

    entry = litellm.model_cost["gpt-4o-mini"]
    per_call = 100 * entry["input_cost_per_token"] + 100 * entry["output_cost_per_token"]
    assert est["total"]["usd"] == pytest.approx(est["total"]["calls"] * per_call)
    est = evolve.dry_run(level_task(models={"policy": {"backend": "litellm", "name": "nobody/no-such-model"}}))
    assert est["total"]["usd"] is None and "unknown" in est["pricing"]["price"]


def test_cli_dry_run_prints_the_table_and_writes_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from evolve.cli.commands import app

    (tmp_path / "task.yaml").write_text(yaml.safe_dump(level_task(budget={"generations": 2, "rollouts": 50})))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["run", "--dry-run", "task.yaml"])
    assert r.exit_code == 0, r.output
    assert "dry run: levels" in r.output and "final test*" in r.output and "97" in r.output
    assert "budget.rollouts = 50 stops the run in gen 2" in r.output
    assert "1, assumed" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["task.yaml"]


def test_a_v1_archive_is_migrated_with_its_call_counts(tmp_path):
    """An archive written before trajectories had calls/duration columns opens, gets them
    filled from the stored JSON, and stays append-only."""
    run = tmp_path / "r"
    with Archive(run) as a:
        a.add_trajectories(
            [
                ("big", "val", "eval", 0, make_traj("s", big=True).model_copy(update={"duration": 2.5})),
                ("small", "val", "eval", 0, make_traj("s")),
            ]
        )
    c = sqlite3.connect(run / "archive.sqlite")  # rebuild it as schema v1 wrote it
    c.executescript("""
        DROP TRIGGER trajectories_no_update; DROP TRIGGER trajectories_no_delete;
        ALTER TABLE trajectories DROP COLUMN calls; ALTER TABLE trajectories DROP COLUMN duration;
        DELETE FROM schema_version; INSERT INTO schema_version VALUES (1, 0);
    """)
    c.close()
    with Archive(run, create=False) as a:
        assert a.usage()["calls"] == 1
        assert a.rollout_metrics("s", "val")["latency"] == pytest.approx(1.25)
        a.add_trajectories([("more", "val", "eval", 0, make_traj("s", big=True))])
        assert a.usage()["calls"] == 2
    c = sqlite3.connect(run / "archive.sqlite")
    assert [v for (v,) in c.execute("SELECT version FROM schema_version ORDER BY version")] == [1, SCHEMA_VERSION]
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        c.execute("UPDATE trajectories SET calls = 9")
    c.close()


def test_budget_fields_are_validated():
    with pytest.raises(ConfigError, match="budget.calls"):
        validate_task(level_task(budget={"calls": 0}))
    with pytest.raises(ConfigError, match="budget.calls_per_rollout"):
        validate_task(level_task(budget={"calls_per_rollout": -1}))
    with pytest.raises(ConfigError, match="did you mean 'calls'"):
        validate_task(level_task(budget={"cals": 3}))


def test_operator_model_calls_count_against_the_budget(tmp_path):
    """A reflecting operator's own calls (outside rollouts) are spent budget: the run's usage holds
    them, and the dry run plans them (one reflection call per child)."""
    import json

    from tests.helpers import DATA
    from tests.prompts.test_prompts import feedback_reward

    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    reflector = {
        "backend": "scripted",
        "name": "reflector",
        "params": {"responses": {"(the sum)": "```\nadd carefully\n```", "default": "no idea"}},
    }
    task.update(
        operators=[{"name": "reflective", "params": {"model": reflector, "minibatch": 3}}],
        budget={"generations": 1},
        engine={"minibatch": 6},
    )
    task["dataset"]["params"] = {"n_train": 12, "n_val": 6, "n_test": 6}
    est = evolve.dry_run(task, base_dir=DATA)
    assert est["phases"][1]["op_calls"] == 1
    report = evolve.run(task, out=tmp_path / "run", reward=feedback_reward, base_dir=DATA)
    asked = sum(len(json.loads(f.read_text())["calls"]) for f in (tmp_path / "run" / "work").glob("*/reflective.json"))
    assert asked == 1
    with Archive(tmp_path / "run", create=False) as a:
        in_rollouts = a.usage()["calls"]
    assert report["budget_used"]["calls"] == in_rollouts + asked


def test_a_call_budget_stops_operator_calls_before_they_are_made(tmp_path):
    """Four reflection calls would pass budget.calls = 13 after 12 rollout calls: only one is made."""
    from tests.helpers import DATA
    from tests.prompts.test_prompts import feedback_reward

    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    reflector = {
        "backend": "scripted",
        "name": "reflector",
        "params": {"responses": {"(the sum)": "```\nadd carefully\n```", "default": "```\nelse\n```"}},
    }
    task.update(
        operators=[{"name": "reflective", "params": {"model": reflector, "minibatch": 3, "children": 4}}],
        engine={"minibatch": 6},
        budget={"generations": 1, "calls": 13},
    )
    task["dataset"]["params"] = {"n_train": 12, "n_val": 6, "n_test": 6}
    report = evolve.run(task, out=tmp_path / "r", reward=feedback_reward, base_dir=DATA)
    assert report["stop_reason"].startswith("call budget of 13 LLM calls spent")
    assert report["budget_used_by_run"]["calls"] == 13


def test_a_call_budget_plans_with_the_workflow_graphs_bound(tmp_path):
    """A topology search that tries a 16-vote must not pass budget.calls by the vote's size."""
    task = vote_search_task(16, {"max_evals": 3, "search_tasks": 20}, {"generations": 1, "calls": 40})
    report = evolve.run(task, out=tmp_path / "r")
    assert report["stop_reason"].startswith("call budget of 40")
    assert report["budget_used_by_run"]["calls"] <= 40
