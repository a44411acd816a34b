"""The curriculum that follows success (engine.curriculum, evolve.loop.curriculum): the band rule, the mix,
the same decisions from the same seed, held-out splits untouched. Runs on the reasoning_gym world with its
scripted solver of fixed skill (right on sums of up to 3 terms and words of up to 6 letters); nothing trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import evolve
from evolve.archive import Archive
from evolve.errors import ConfigError
from evolve.loop.curriculum import Groups, decide, judge, shares
from evolve.task.config import CurriculumConfig
from evolve.task.taskfile import validate_task

SMOKE = Path(__file__).parents[2] / "examples" / "reasoning_gym" / "smoke.yaml"
ANSWER = (
    "Solve the problem. End your reply with one line that gives the final answer alone, written as: Answer: <answer>"
)
SEEN: list[dict] = []  # what the recording operator was given, per call


@pytest.fixture(autouse=True)
def _package():
    pytest.importorskip("reasoning_gym")


def task(**change) -> dict:
    """The smoke task file, answering from the start (so success is the solver's skill alone)."""
    data = yaml.safe_load(SMOKE.read_text())
    data["prompts"]["instruction"] = ANSWER
    for path, value in change.items():
        node = data
        *head, last = path.split("__")
        for k in head:
            node = node[k]
        node[last] = value
    return data


def decisions(run: Path) -> list[dict]:
    from evolve.scoring.state import RunState

    return RunState(Archive(run, create=False)).curricula()


def test_the_band_rule_moves_up_on_success_down_on_failure_and_holds_in_between():
    band = (0.2, 0.8)
    assert judge(0, 2, 0.9, band) == (1, "up") and judge(2, 2, 0.9, band) == (2, "mastered")
    assert judge(2, 2, 0.1, band) == (1, "down") and judge(0, 2, 0.1, band) == (0, "too hard")
    assert judge(1, 2, 0.5, band) == judge(1, 2, 0.8, band) == judge(1, 2, 0.2, band) == (1, "in band")
    assert shares(10, [1, 1, 1]) == [4, 3, 3] and shares(5, [0.2, 0.8]) == [1, 4]


def test_the_mix_shifts_toward_groups_in_the_band_and_a_move_restores_full_weight():
    cfg = CurriculumConfig(off_band=0.25, min_samples=4)
    train = [
        {"id": f"{g}{lv}{i}", "generator": g, "level": lv, "x": 0}
        for g in ("a", "b", "c")
        for lv in (0, 1)
        for i in range(5)
    ]
    groups = Groups.of(train, cfg)
    start = decide(cfg, groups, None, {}, 1)
    assert start["levels"] == {"a": 0, "b": 0, "c": 0} and start["mix"] == pytest.approx(dict.fromkeys("abc", 1 / 3))
    prev = dict(start, levels={"a": 1, "b": 0, "c": 0})
    # a: mastered at its hardest level; b: in the band; c: too hard at its easiest; all on 10 rollouts
    d = decide(cfg, groups, prev, {"a": (10, 10), "b": (10, 5), "c": (10, 0)}, 2)
    assert d["moves"] == {"a": "mastered", "b": "in band", "c": "too hard"}
    assert d["mix"]["b"] == pytest.approx(4 / 6) and d["mix"]["a"] == d["mix"]["c"] == pytest.approx(1 / 6)
    # the next time a is judged in the band it is back at full weight; c too few rollouts: it holds as it was
    d2 = decide(cfg, groups, d, {"a": (10, 7), "b": (10, 9), "c": (2, 2)}, 3)
    assert d2["moves"] == {"a": "in band", "b": "up", "c": "hold (few rollouts)"}
    assert d2["levels"] == {"a": 1, "b": 1, "c": 0} and d2["factors"] == {"a": 1.0, "b": 1.0, "c": 0.25}


def test_difficulty_follows_the_agents_success_up_and_down_in_a_run(tmp_path):
    report = evolve.run(task(budget__generations=5), out=tmp_path / "r")
    rows = [(d["levels"]["basic_arithmetic"], d["moves"]["basic_arithmetic"]) for d in decisions(tmp_path / "r")]
    # sums of 2, then 3 terms are solved (above the band: up); 5 terms never (below: down)
    assert rows == [(0, "start"), (1, "up"), (2, "up"), (1, "down"), (2, "up")]
    spell = [d["levels"]["spell_backward"] for d in decisions(tmp_path / "r")]
    assert spell == [0, 1, 2, 1, 2]
    assert [g["levels"] for g in report["curriculum"]["generations"]] == [
        d["levels"] for d in decisions(tmp_path / "r")
    ]


def test_the_mix_moves_to_the_generator_in_the_band_in_a_run(tmp_path):
    gens = [
        {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}},  # always solved
        {"name": "spell_backward", "config": {"min_word_len": 5, "max_word_len": 8}},
    ]  # about half solved
    report = evolve.run(
        task(dataset__params__generators=gens, engine__minibatch=24, budget__generations=3), out=tmp_path / "r"
    )
    ds = decisions(tmp_path / "r")
    assert ds[1]["moves"] == {"chain_sum": "mastered", "spell_backward": "in band"}
    assert ds[1]["mix"]["spell_backward"] == pytest.approx(0.8)
    assert ds[1]["pool"] == {"chain_sum": 37, "spell_backward": 150}  # all 150 words, sums in the mix beside them
    mb = {g: sum(t.startswith(f"rg-train-{g}") for t in ds[1]["minibatch"]) for g in ("chain_sum", "spell_backward")}
    assert mb == {"chain_sum": 5, "spell_backward": 19}  # the minibatch drawn in the new mix
    assert report["curriculum"]["generations"][1]["mix"] == ds[1]["mix"]


def test_the_same_seed_decides_the_same_and_another_seed_draws_other_tasks(tmp_path):
    a = evolve.run(task(), out=tmp_path / "a")
    b = evolve.run(task(), out=tmp_path / "b")
    evolve.run(task(seed=1), out=tmp_path / "c")
    da, db, dc = (decisions(tmp_path / x) for x in "abc")
    strip = lambda ds: [{k: v for k, v in d.items() if k != "parents"} for d in ds]  # noqa: E731
    assert strip(da) == strip(db) and a["curriculum"] == b["curriculum"]
    assert [d["minibatch"] for d in dc] != [d["minibatch"] for d in da]


def test_resuming_reuses_the_decisions_made_and_goes_on_as_one_run_would(tmp_path):
    straight = evolve.run(task(budget__generations=4), out=tmp_path / "s")
    evolve.run(task(budget__generations=2), out=tmp_path / "r")
    first = decisions(tmp_path / "r")
    evolve.run(task(budget__generations=4), out=tmp_path / "r", resume=True)
    resumed = decisions(tmp_path / "r")
    assert resumed[:2] == first
    assert [d["levels"] for d in resumed] == [d["levels"] for d in decisions(tmp_path / "s")]
    assert straight["curriculum"]["generations"][-1]["levels"] == resumed[-1]["levels"]


class Recorder:
    """An operator that proposes nothing and records the training tasks it was given."""

    name = "recorder"

    def propose(self, parent, ctx):
        SEEN.append({"generation": ctx.generation, "train": [dict(t) for t in ctx.train]})
        return []


def test_operators_train_at_the_chosen_levels_and_val_and_test_never_change(tmp_path):
    SEEN.clear()
    with_c = evolve.run(
        task(operators=[{"name": "tests.evolve.test_curriculum:Recorder"}], budget__generations=3),
        out=tmp_path / "with",
    )
    ds = decisions(tmp_path / "with")
    for seen in SEEN:
        levels = ds[seen["generation"] - 1]["levels"]
        assert seen["train"] and all(
            t["split"] == "train" and t["level"] == levels[t["generator"]] for t in seen["train"]
        )
    assert {s["generation"]: {t["level"] for t in s["train"]} for s in SEEN} == {1: {0}, 2: {1}, 3: {2}}
    without = task(operators=[{"name": "tests.evolve.test_curriculum:Recorder"}], budget__generations=3)
    without["engine"].pop("curriculum")
    plain = evolve.run(without, out=tmp_path / "without")
    for split in ("val", "test"):
        a, b = Archive(tmp_path / "with", create=False), Archive(tmp_path / "without", create=False)
        assert a.task_scores(with_c["baseline"]["system_id"], split) == b.task_scores(
            plain["baseline"]["system_id"], split
        )
        assert with_c["baseline"][split] == plain["baseline"][split]
    # without a curriculum the operators see the whole training split
    assert {t["level"] for t in SEEN[-1]["train"]} == {0, 1, 2}


def test_a_curriculum_it_cannot_follow_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="engine.curriculum draws each generation's minibatch itself"):
        validate_task(task(engine={"minibatch": 12, "minibatch_sampler": "fixed", "curriculum": {}}))
    with pytest.raises(ConfigError, match=r"band must be \[low, high\] with 0 <= low < high <= 1"):
        validate_task(task(engine={"curriculum": {"band": [0.8, 0.2]}}))
    toy = yaml.safe_load((Path(__file__).parents[1] / "data" / "toy.yaml").read_text())
    toy["engine"]["curriculum"] = {}
    with pytest.raises(ConfigError, match="engine.curriculum: training task 'train-0' has no 'generator'"):
        evolve.run(toy, out=tmp_path / "toy")
    toy["engine"]["curriculum"] = {"group_key": "a", "level_key": "b"}  # the toy's tasks have a and b fields
    assert evolve.run(toy, out=tmp_path / "toy")["curriculum"]["generations"]


class Sampler:
    """An operator that samples 5 training tasks of each generator twice from the parent, as STaR
    samples (greedily here: the scripted solver slips one sampled answer in 4), and proposes nothing."""

    name = "sampler"

    def propose(self, parent, ctx):
        by_group: dict[str, list] = {}
        for t in ctx.train:
            by_group.setdefault(t["generator"], []).append(t)
        ctx.rollouts(parent, [t for ts in by_group.values() for t in ts[:5]], samples=2, tag="sample")
        return []


@pytest.mark.parametrize("evidence", ["minibatch", "all"])
def test_with_evidence_all_the_operators_samples_count_beside_the_minibatch(tmp_path, evidence):
    ops = [{"name": "tests.evolve.test_curriculum:Sampler"}]
    evolve.run(
        task(
            operators=ops,
            engine__minibatch=2,
            budget__generations=2,
            engine__curriculum={"min_samples": 4, "evidence": evidence},
        ),
        out=tmp_path / "r",
    )
    first, second = decisions(tmp_path / "r")[:2]
    archive = Archive(tmp_path / "r", create=False)
    sampled = archive.outcomes(system_ids=first["parents"], generations=[1], explore=True)
    assert len(sampled) == 20 and all(k.startswith("sample:g1:op0/") for k in sampled)
    counted = {g: s["n"] for g, s in second["success"].items()}
    if evidence == "minibatch":  # one minibatch rollout a group: too few to move
        assert counted == {"basic_arithmetic": 1, "spell_backward": 1}
        assert set(second["moves"].values()) == {"hold (few rollouts)"}
    else:  # and 10 samples a group: sums of 2 terms and short words are always right, so both go up
        assert counted == {"basic_arithmetic": 11, "spell_backward": 11}
        assert second["moves"] == {"basic_arithmetic": "up", "spell_backward": "up"}
        assert all(s["solved"] == s["n"] for s in second["success"].values())
    report = (tmp_path / "r" / "report.md").read_text()
    assert ("operators' samples from them" in report) == (evidence == "all")
