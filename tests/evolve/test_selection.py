"""Selection over the per-task Pareto front, the pool operators see, and re-evaluation of close
calls for noisy graders (scripted agents and rewards from tests/helpers/agents.py)."""

import random
from collections import Counter
from typing import ClassVar

import pytest

import evolve
from evolve.archive import Archive
from evolve.errors import ConfigError
from evolve.loop.selectors import Best, Pareto, Scored
from evolve.registry import operators as operator_registry
from evolve.registry import selectors as selector_registry
from evolve.task.taskfile import validate_task
from evolve.types import System
from tests.evolve.test_budget import level_task
from tests.helpers.agents import NOISY, LevelUp

operator_registry.register("level_up", LevelUp)

# A and B split the tasks; C has the best mean but is best on no task; D is bad but costs nothing.
POOL = [
    Scored("A", 2 / 3, 0, per_task={"t1": 1.0, "t2": 1.0, "t3": 0.0}, metrics={"cost": 0.3, "latency": 1.0}),
    Scored("B", 1 / 3, 1, per_task={"t1": 0.0, "t2": 0.0, "t3": 1.0}, metrics={"cost": 0.2, "latency": 2.0}),
    Scored("C", 0.7, 1, per_task={"t1": 0.7, "t2": 0.7, "t3": 0.7}, metrics={"cost": 0.3, "latency": 1.0}),
    Scored("D", 0.0, 2, per_task={"t1": 0.0, "t2": 0.0, "t3": 0.0}, metrics={"cost": 0.0, "latency": 3.0}),
]


def test_pareto_samples_the_front_weighted_by_tasks_won():
    sel = Pareto()
    assert sel.front(POOL) == ["A", "B"]
    picks = Counter(sel.select(POOL, 1, random.Random(i))[0] for i in range(600))
    assert set(picks) == {"A", "B"}
    assert 0.6 < picks["A"] / 600 < 0.73  # A is best on 2 tasks of 3, B on 1
    assert sorted(sel.select(POOL, 5, random.Random(0))) == ["A", "B"]  # distinct parents, at most the front
    assert sel.select(POOL, 2, random.Random(7)) == sel.select(POOL, 2, random.Random(7))
    assert Best().select(POOL, 1, random.Random(0)) == ["C"]  # what the mean alone would pick


def test_pareto_objectives_keep_the_cheapest_and_fastest():
    assert Pareto(objectives=["cost"]).front(POOL) == ["A", "B", "D"]
    # C ties A for the fastest, and nothing dominates it (it beats A on t3, B on t1 and t2)
    assert Pareto(objectives=["latency"]).front(POOL) == ["A", "B", "C"]
    # a system no better than A on any task but cheaper stays on the front only with the objective
    pool = POOL[:1] + [Scored("A2", 2 / 3, 3, per_task=POOL[0].per_task, metrics={"cost": 0.1, "latency": 1.0})]
    assert Pareto().front(pool) == ["A", "A2"]  # identical scores: neither dominates
    assert Pareto(objectives=["cost"]).front(pool) == ["A2"]


def test_selector_params_are_validated_and_passed():
    with pytest.raises(ConfigError, match=r"engine\.selector_params\.objectives\.0.*'cost', 'calls' or 'latency'"):
        validate_task(level_task(engine={"selector": "pareto", "selector_params": {"objectives": ["money"]}}))
    with pytest.raises(ConfigError, match="engine.selector_params.*selector 'best' takes no parameters"):
        validate_task(level_task(engine={"selector_params": {"k": 1}}))
    with pytest.raises(ConfigError, match=r"selector 'tournament' takes \['size'\]"):
        validate_task(level_task(engine={"selector": "tournament", "selector_params": {"sise": 2}}))
    validate_task(level_task(engine={"selector": "tournament", "selector_params": {"size": 2}}))


class Spy(Pareto):
    """The Pareto selector, recording the pools the engine hands it."""

    seen: ClassVar[list] = []

    def select(self, pool, k, rng):
        Spy.seen.append(list(pool))
        return super().select(pool, k, rng)


class PoolReader(LevelUp):
    """LevelUp that records ``ctx.extra["pool"]`` as it finds it."""

    seen: ClassVar[list] = []
    before: ClassVar[list] = []

    def propose(self, parent, ctx):
        PoolReader.before.append(repr(ctx.extra["pool"]))
        PoolReader.seen.append([dict(e) for e in ctx.extra["pool"]])
        return super().propose(parent, ctx)


def test_engine_hands_per_task_scores_metrics_and_the_pool(tmp_path):
    selector_registry.register("spy", Spy)
    operator_registry.register("pool_reader", PoolReader)
    Spy.seen.clear()
    PoolReader.seen.clear()
    PoolReader.before.clear()
    task = level_task(
        engine={
            "minibatch": 4,
            "parents": 2,
            "selector": "spy",
            "selector_params": {"objectives": ["cost", "latency"]},
        },
        operators=[{"name": "pool_reader", "params": {"children": 2, "explore": 0}}],
    )
    report = evolve.run(task, out=tmp_path / "r")
    assert report["stop_reason"] == "generations done"
    gen1, gen2 = Spy.seen
    val_ids = {f"val-{i}" for i in range(6)}
    assert [s.system_id for s in gen1] == [report["baseline"]["system_id"]]
    assert len(gen2) == 3 and all(set(s.per_task) == val_ids for s in gen2)
    assert sorted(s.per_task["val-0"] for s in gen2) == [0.0, 0.01, 0.02]  # levels 0, 1, 2
    for s in gen2:
        assert s.metrics["cost"] == pytest.approx(0.001) and s.metrics["calls"] == 1.0 and s.metrics["latency"] >= 0
    # the pool an operator sees: accepted systems with their scores and per-task scores, loaded on first use
    # (generation 2 has one or two parents: the level-2 child dominates the others on every task, but
    # the measured latency may put a faster one on the front too; the first call sees the same pool)
    first, last = PoolReader.seen[0], PoolReader.seen[1]
    assert len(first) == 1 and isinstance(first[0]["system"], System) and first[0]["score"] == 0.0
    assert sorted(e["system"].prompts["level"] for e in last) == ["0", "1", "2"]
    assert sorted(e["score"] for e in last) == [0.0, 0.01, 0.02]
    assert all(set(e["per_task"]) == val_ids for e in last)
    assert set(PoolReader.before) == {"OperatorPool(not loaded)"}  # nothing is read until an operator looks


def noisy_task(choice: str, reeval: dict | None) -> dict:
    return level_task(
        agent="tests.helpers.agents:kind_agent",
        reward="tests.helpers.agents:noisy_reward",
        prompts={"kind": "steady"},
        operators=[{"name": "scripted", "params": {"component": "kind", "choices": [choice]}}],
        budget={"generations": 1},
        engine={"minibatch": 4, "reeval": reeval},
    )


def test_a_lucky_child_is_accepted_without_reeval(tmp_path):
    report = evolve.run(noisy_task("lucky", None), out=tmp_path / "r")
    (decision,) = Archive(tmp_path / "r", create=False).events("decision")
    assert decision["accepted"] and "reeval" not in decision
    assert report["best"]["system_id"] == decision["child"]


def test_reeval_rejects_a_lucky_child_on_the_means(tmp_path):
    report = evolve.run(noisy_task("lucky", {"margin": 0.05, "samples": 2}), out=tmp_path / "r")
    a = Archive(tmp_path / "r", create=False)
    (decision,) = a.events("decision")
    assert not decision["accepted"] and "rejected at stage 2: val mean of 3 samples" in decision["why"]
    (note,) = decision["reeval"]
    lucky, steady = NOISY["lucky"], NOISY["steady"]
    assert note["against"] == "parent" and note["samples"] == 3
    assert note["child_score"] == pytest.approx(lucky[0]) and note["other_score"] == pytest.approx(steady[0])
    assert note["child_mean"] == pytest.approx((lucky[0] + 2 * lucky[1]) / 3)
    assert note["other_mean"] == pytest.approx(steady[0])
    # two more samples of every val task for both, with other sample indices (so other seeds)
    for sid in (decision["child"], decision["parent"]):
        rows = list(a.trajectory_rows(system_id=sid, split="val"))
        assert Counter(r.trajectory.sample for r in rows) == {0: 6, 1: 6, 2: 6}
        assert len({r.key for r in rows}) == 18
    assert report["best"]["system_id"] == report["baseline"]["system_id"]


def test_reeval_accepts_and_promotes_a_truly_better_child(tmp_path):
    evolve.run(noisy_task("better", {"margin": 0.05, "samples": 2}), out=tmp_path / "r")
    a = Archive(tmp_path / "r", create=False)
    (decision,) = a.events("decision")
    assert decision["accepted"] and "promoted" in decision["why"]
    assert [n["against"] for n in decision["reeval"]] == ["parent", "best"]
    assert all(
        n["child_mean"] == pytest.approx(0.53) and n["other_mean"] == pytest.approx(0.5) for n in decision["reeval"]
    )
    assert a.current() == decision["child"]
    # its score from now on is the mean over all samples; a far-apart call is not re-evaluated
    assert a.get_state("reevaluated")[decision["child"]] == [pytest.approx(0.53), 1]
    n_val = len(a.trajectory_rows(split="val"))
    assert n_val == 2 * 18  # memoised: the parent and the best are the same system, re-evaluated once


def test_reeval_off_by_default_and_validated():
    assert validate_task(level_task()).engine.reeval is None
    with pytest.raises(ConfigError, match="engine.reeval.samples"):
        validate_task(level_task(engine={"reeval": {"samples": 0}}))


def test_a_child_better_on_the_means_is_promoted_over_a_lucky_parent(tmp_path):
    """The parent's first sample is lucky (0.53, later 0.40); the child scores 0.54, later 0.45.
    Stage 2 re-evaluates the close call (means 0.48 vs 0.44); promotion must then compare means
    too, not the child's mean against the parent's single lucky 0.53."""
    task = level_task(
        agent="tests.helpers.agents:kind_agent",
        reward="tests.helpers.agents:noisy_reward",
        prompts={"kind": "lucky"},
        operators=[{"name": "scripted", "params": {"component": "kind", "choices": ["solid"]}}],
        budget={"generations": 1},
        engine={"minibatch": 4, "reeval": {"margin": 0.02, "samples": 2}},
    )
    report = evolve.run(task, out=tmp_path / "r")
    a = Archive(tmp_path / "r", create=False)
    (decision,) = a.events("decision")
    assert decision["accepted"] and "promoted" in decision["why"] and "not promoted" not in decision["why"]
    assert report["best"]["system_id"] == decision["child"] == a.current()
