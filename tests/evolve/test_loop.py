"""The loop's strategies (evolve.loop.strategies): acceptance, the minibatch, stopping; each named in the task file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

import evolve
from evolve.archive import Archive
from evolve.errors import ConfigError
from evolve.task.taskfile import validate_task

DATA = Path(__file__).parents[1] / "data"


def toy(**engine) -> dict:
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    data["engine"].update(engine)
    return data


def _minibatches(run: Path) -> dict[int, set[str]]:
    """The training tasks each generation's parent was rolled out on."""
    out: dict[int, set[str]] = {}
    for r in Archive(run, create=False).trajectory_rows(split="train", phase="eval"):
        out.setdefault(r.generation, set()).add(r.trajectory.task_id)
    return out


def test_val_only_acceptance_never_rolls_a_child_out_on_the_minibatch(tmp_path):
    two = evolve.run(toy(), out=tmp_path / "two")
    val_only = evolve.run(toy(acceptance="val_only"), out=tmp_path / "val")
    a = Archive(tmp_path / "val", create=False)
    judged = {(e["generation"], e["child"]) for e in a.events("decision")}  # (generation, child)
    on_minibatch = {(r.generation, r.trajectory.system_id) for r in a.trajectory_rows(split="train")}
    assert judged and not judged & on_minibatch  # (a child accepted is a parent later, rolled out then)
    assert all("stage 1" not in e["why"] for e in a.events("decision"))
    assert val_only["best"]["test"]["score"] == two["best"]["test"]["score"] == 1.0  # the toy's known answer


def test_a_fixed_minibatch_is_the_same_tasks_every_generation(tmp_path):
    evolve.run(toy(minibatch_sampler="fixed"), out=tmp_path / "fixed")
    fixed = _minibatches(tmp_path / "fixed")
    assert len(fixed) >= 2 and len({frozenset(v) for v in fixed.values()}) == 1
    evolve.run(toy(), out=tmp_path / "random")
    assert len({frozenset(v) for v in _minibatches(tmp_path / "random").values()}) > 1


def test_a_plateau_stops_the_run_and_says_why(tmp_path):
    data = toy(stopping="plateau", stopping_params={"patience": 1})
    data["budget"]["generations"] = 20
    report = evolve.run(data, out=tmp_path / "r")
    assert report["stop_reason"].startswith("plateau: the best val score has not risen for 1 generation")
    assert len(report["generations"]) < 21
    with pytest.raises(ConfigError, match="engine.stopping_params"):
        validate_task(toy(stopping="plateau", stopping_params={"patience": 0}))
    with pytest.raises(ConfigError, match="unknown acceptance 'two_stages'; did you mean 'two_stage'"):
        validate_task(toy(acceptance="two_stages"))


class AcceptAll:
    """A strategy of one's own, by import path: every child joins, none is promoted."""

    def judge(self, session, generation, candidate, minibatch, parent, parent_minibatch_score, parent_val_score):
        from evolve.loop.acceptance import Verdict

        score, _ = session.evaluate(candidate.system, "val", generation)
        return Verdict(True, score, f"accepted unconditionally (val {score:.3f})")

    def promote(self, session, generation, candidate, verdict, best):
        return False, best


def test_an_acceptance_of_ones_own_by_import_path(tmp_path):
    report = evolve.run(toy(acceptance="tests.evolve.test_loop:AcceptAll"), out=tmp_path / "r")
    decisions = Archive(tmp_path / "r", create=False).events("decision")
    assert decisions and all(e["accepted"] and "unconditionally" in e["why"] for e in decisions)
    assert report["best"]["system_id"] == report["baseline"]["system_id"]  # never promoted
    assert json.loads((tmp_path / "r" / "report.json").read_text())["stop_reason"] == "generations done"


def test_paired_acceptance_keeps_only_a_gain_whose_val_interval_is_above_zero(tmp_path):
    paired = evolve.run(toy(acceptance="paired"), out=tmp_path / "p")
    assert paired["best"]["test"]["score"] == 1.0  # "add carefully" beats the rest beyond noise on 20 val tasks
    events = Archive(tmp_path / "p", create=False).events("decision")
    promoted = [e for e in events if "; promoted (paired" in e["why"]]
    assert promoted and all(e["reeval"][-1]["paired"]["low"] > 0 for e in promoted)
    assert all(
        re.search(r"paired [+-]\d+\.\d points \[[+-]\d+\.\d, [+-]\d+\.\d\] on 20 val tasks", e["why"])
        for e in events
        if e["accepted"]
    )
    # at an interval no 20-task gain can clear, no child is kept as the best, though some beat their parent's mean
    strict = evolve.run(toy(acceptance="paired", acceptance_params={"z": 50}), out=tmp_path / "s")
    assert strict["best"]["system_id"] == strict["baseline"]["system_id"]
    events = Archive(tmp_path / "s", create=False).events("decision")
    assert any(e["accepted"] and "not promoted" in e["why"] for e in events)
    with pytest.raises(ConfigError, match="engine.acceptance_params"):
        validate_task(toy(acceptance="paired", acceptance_params={"z": 0}))
    with pytest.raises(ConfigError, match="engine.acceptance_params"):
        validate_task(toy(acceptance="two_stage", acceptance_params={"z": 2}))


def test_the_old_loop_module_paths_still_resolve_with_a_deprecation_warning():
    import importlib
    import sys

    from evolve.loop import acceptance, strategies

    for old, name, new in [
        ("evolve.loop.policies", "build_policies", strategies.build_strategies),
        ("evolve.loop.policies", "TwoStage", strategies.TwoStage),
        ("evolve.loop.judge", "judge", acceptance.judge),
    ]:
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=old):
            assert getattr(importlib.import_module(old), name) is new
