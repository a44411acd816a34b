"""The paired comparison the run report prints next to a gain."""

import math

import pytest

from evolve.results.stats import describe, paired, sign_test


@pytest.mark.parametrize("wins,losses,p", [
    (24, 5, 0.0005461126565933228),   # scipy.stats.binomtest(24, 29).pvalue
    (25, 13, 0.07295138851623051),
    (12, 16, 0.5715881884098053),
    (10, 0, 0.001953125),             # 2 / 2**10
    (3, 3, 1.0),
    (0, 0, 1.0),
])
def test_sign_test_matches_the_exact_binomial(wins, losses, p):
    assert sign_test(wins, losses) == pytest.approx(p, rel=1e-12)
    assert sign_test(losses, wins) == pytest.approx(p, rel=1e-12)


def test_paired_uses_only_common_tasks_and_the_paired_spread():
    a = {1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0, 9: 1.0}
    b = {1: 1.0, 2: 1.0, 3: 0.0, 4: 1.0, 5: 1.0}
    c = paired(a, b)
    assert (c["n"], c["a"], c["b"], c["diff"]) == (4, 0.5, 0.75, 0.25)
    # differences 0, 1, -1, 1: sample variance 11/12, so 1.96 * sqrt(11/12 / 4)
    assert c["ci95"] == pytest.approx(1.96 * math.sqrt(11 / 48))
    assert (c["b_only"], c["a_only"], c["p"]) == (2, 1, 1.0)


def test_identical_systems_differ_by_nothing():
    s = {k: float(k % 3 == 0) for k in range(30)}
    c = paired(s, dict(s))
    assert (c["diff"], c["ci95"], c["b_only"], c["a_only"], c["p"]) == (0.0, 0.0, 0, 0, 1.0)


def test_partial_scores_and_empty_overlap():
    c = paired({"x": 0.5, "y": 0.25}, {"x": 0.75, "y": 0.25})
    assert (c["diff"], c["b_only"], c["a_only"]) == (0.125, 1, 0)
    assert paired({"x": 1.0}, {"y": 1.0})["n"] == 0
    assert describe(paired({"x": 1.0}, {"y": 1.0})) == "no tasks in common"


def test_describe_names_the_interval_and_the_counts():
    a = {k: 0.0 for k in range(300)}
    b = {k: float(k < 24) for k in range(300)}
    line = describe(paired(a, b))
    assert line.startswith("+8.0 points (95% CI ±3.1; 24 tasks better with the best system, 0 with the baseline")
    assert "n=300" in line
