"""The paired comparison the run report prints next to a gain, and a score's interval."""

import math

import pytest

from evolve.results.stats import bounds, describe, interval, paired, sign_test, wilson


@pytest.mark.parametrize(
    "wins,losses,p",
    [
        (24, 5, 0.0005461126565933228),  # scipy.stats.binomtest(24, 29).pvalue
        (25, 13, 0.07295138851623051),
        (12, 16, 0.5715881884098053),
        (10, 0, 0.001953125),  # 2 / 2**10
        (3, 3, 1.0),
        (0, 0, 1.0),
    ],
)
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
    assert (c["diff"], c["b_only"], c["a_only"], c["p"]) == (0.0, 0, 0, 1.0)
    # no task differs, yet 30 tasks cannot rule out a small difference: Agresti and Min's width, not 0
    assert c["ci95"] == pytest.approx(1.96 * math.sqrt((1 / 32) / 32))


def test_partial_scores_and_empty_overlap():
    c = paired({"x": 0.5, "y": 0.25}, {"x": 0.75, "y": 0.25})
    assert (c["diff"], c["b_only"], c["a_only"]) == (0.125, 1, 0)
    none = paired({"x": 1.0}, {"y": 1.0})
    assert none["n"] == 0 and none["p"] is None and none["ci95"] is None and bounds(none) is None
    assert describe(none) == "no task in common"


def test_describe_names_the_interval_and_the_counts():
    a = dict.fromkeys(range(300), 0.0)
    b = {k: float(k < 24) for k in range(300)}
    line = describe(paired(a, b))
    assert line.startswith("+8.0 points (95% CI ±3.1; 24 tasks better with the best system, 0 with the baseline")
    assert "n=300" in line


@pytest.mark.parametrize(
    "k,n,low,high",
    [
        (15, 15, 0.7961166989641515, 1.0),  # scipy.stats.binomtest(k, n).proportion_ci(method="wilson")
        (1, 12, 0.014865094404917123, 0.35387991114111694),
        (0, 7, 0.0, 0.35433043506668743),
        (12, 24, 0.3142742581957335, 0.6857257418042665),
    ],
)
def test_a_scores_interval_is_wilsons_and_stays_in_0_1(k, n, low, high):
    assert wilson(k / n, n) == pytest.approx((low, high), rel=2e-4, abs=1e-4)
    mean = k / n  # 0/1 scores: the mean of squares is the mean
    lo, hi = interval(mean, mean, n)
    assert 0.0 <= lo < mean or mean == 0.0
    assert mean < hi <= 1.0 or mean == 1.0
    assert (lo, hi) == wilson(mean, n)


def test_scores_outside_0_1_keep_the_normal_interval():
    lo, hi = interval(2.0, 5.0, 10, unit=False)  # variance 1 (sample 10/9)
    assert hi - 2.0 == pytest.approx(2.0 - lo) == pytest.approx(1.96 * math.sqrt(10 / 9 / 10))
    assert interval(2.0, 4.0, 1, unit=False) is None and interval(0.5, 0.5, 0) is None


def test_a_paired_interval_never_leaves_the_possible_differences():
    # three tasks gained, one tied: the normal interval reaches +124 points, past what 0/1 scores can differ by
    c = paired(dict.fromkeys(range(4), 0.0), {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0})
    assert c["diff"] + c["ci95"] > 1.0 and (c["low"], c["high"]) == (pytest.approx(c["diff"] - c["ci95"]), 1.0)
    assert describe(c).startswith("+75.0 points (95% CI [+23.3, +100.0]; 3 tasks better")
    two = paired({0: 0.0, 1: 1.0}, {0: 1.0, 1: 0.0})
    assert (two["low"], two["high"]) == (-1.0, 1.0)
    # an older report.json (no low/high) is read within the bounds too
    old = {k: v for k, v in c.items() if k not in ("low", "high")}
    assert bounds(old) == (c["low"], c["high"]) and "[+23.3, +100.0]" in describe(old)
    # scores beyond [0, 1]: nothing is known of the bounds, the interval stays as computed
    wide = paired(dict.fromkeys(range(4), 0.0), {0: 3.0, 1: 3.0, 2: 3.0, 3: 0.0})
    assert wide["high"] == pytest.approx(wide["diff"] + wide["ci95"]) and "±" in describe(wide)


def test_a_paired_interval_is_never_empty_when_every_difference_is_the_same():
    """20 wins in 20 tasks: a normal approximation reads +100.0 ±0.0; the pseudo-pairs give a real width."""
    from evolve.results.stats import describe, paired

    c = paired(dict.fromkeys(range(20), 0.0), dict.fromkeys(range(20), 1.0))
    assert c["diff"] == 1.0 and 0.1 < c["ci95"] < 0.2 and c["high"] == 1.0 and 0.8 < c["low"] < 0.9
    assert "[+85.0, +100.0]" in describe(c)
    same = paired(dict.fromkeys(range(10), 0.5), dict.fromkeys(range(10), 0.5))
    assert same["diff"] == 0.0 and same["ci95"] > 0.05  # no difference seen in 10 tasks is not "exactly 0"
