"""Worlds (evolve.world): a task file that names a world gets its agent, reward, dataset and
the hooks the layers use; a world of one's own works the same way."""

from __future__ import annotations

import pytest

import evolve
from evolve.errors import ConfigError
from evolve.task.taskfile import validate_task
from evolve.world import World, load_world

SCRIPTED = {"backend": "scripted", "name": "toy", "params": {"reply": "evolve.worlds.toy:reply"}}


def test_a_world_fills_what_the_task_file_leaves_out():
    cfg = validate_task(
        {
            "world": "sql",
            "models": {"policy": {"backend": "local", "cold_start": {"n_demos": 10}}},
            "dataset": {"params": {"n_train": 10}},
            "operators": [
                {"name": "memory", "params": {"embedder": "hashing"}},
                {"name": "toolforge"},
                {"name": "topology"},
            ],
        }
    )
    assert (cfg.agent, cfg.reward, cfg.dataset.source) == (
        "evolve.worlds.sql:agent",
        "evolve.worlds.sql:reward",
        "evolve.worlds.sql:dataset",
    )
    assert cfg.dataset.params == {"n_train": 10}
    assert cfg.models["policy"].cold_start.demos == "evolve.worlds.sql:demos"
    assert cfg.operators[0].params["extract"] == "evolve.worlds.sql:experiences"
    assert cfg.operators[1].params["miner"] == "evolve.worlds.sql:mine_tools"
    assert cfg.operators[2].params["palette"] == "evolve.worlds.sql.workflow:PALETTE"
    # what the task file sets wins
    mine = validate_task(
        {
            "world": "sql",
            "agent": "evolve.worlds.toy:agent",
            "models": {"policy": SCRIPTED},
            "operators": [{"name": "memory", "params": {"extract": "my:extract"}}],
        }
    )
    assert mine.agent == "evolve.worlds.toy:agent" and mine.operators[0].params["extract"] == "my:extract"


def test_without_a_world_a_world_setting_is_asked_for_with_the_hook_that_would_give_it():
    base = {
        "agent": "evolve.worlds.toy:agent",
        "reward": "evolve.worlds.toy:reward",
        "models": {"policy": SCRIPTED},
        "dataset": {"source": "evolve.worlds.toy:dataset"},
    }
    with pytest.raises(ConfigError, match=r"operators.0.params.extract: required field is missing.*memory.extract"):
        validate_task({**base, "operators": [{"name": "memory"}]})
    with pytest.raises(ConfigError, match="abstraction needs a miner"):
        validate_task({**base, "operators": [{"name": "toolforge"}]})
    assert validate_task({**base, "operators": [{"name": "toolforge", "params": {"abstraction": False}}]})
    with pytest.raises(ConfigError, match="world: unknown world 'sqll'; did you mean 'sql'"):
        validate_task({**base, "world": "sqll"})


def test_the_toy_world_runs_from_its_name(tmp_path):
    report = evolve.run(
        {
            "world": "toy",
            "models": {"policy": SCRIPTED},
            "prompts": {"instruction": "add carefully"},
            "budget": {"generations": 0},
        },
        out=tmp_path / "r",
    )
    assert report["baseline"]["test"]["score"] == 1.0


WORLD = World(
    name="doubling",
    agent="tests.worlds.test_worlds:double_agent",
    reward="tests.worlds.test_worlds:exact",
    dataset="tests.worlds.test_worlds:numbers",
)


def double_agent(task, ctx):
    return task["x"] * 2


def exact(task, output):
    return float(output == task["y"])


def numbers(seed=0):
    return {split: [{"id": f"{split}{i}", "x": i, "y": 2 * i} for i in range(5)] for split in ("train", "val", "test")}


def test_a_world_of_ones_own_by_import_path(tmp_path):
    assert load_world("tests.worlds.test_worlds:WORLD") is WORLD
    report = evolve.run(
        {
            "world": "tests.worlds.test_worlds:WORLD",
            "models": {"policy": {"backend": "scripted", "name": "x"}},
            "budget": {"generations": 0},
        },
        out=tmp_path / "r",
    )
    assert report["baseline"]["val"]["score"] == 1.0
    with pytest.raises(ConfigError, match="unknown hook"):
        World(name="w", agent="a:b", reward="a:b", dataset="a:b", hooks={"memory.extrakt": "x:y"})
    with pytest.raises(ConfigError, match="not an evolve.worlds.World"):
        load_world("tests.worlds.test_worlds:numbers")
