"""soar.stats, the seed as the unit: against hand computations and scipy's own functions."""

import itertools

import numpy as np
import pytest
from scipy import stats

from soar.stats import icc, last_third, mean_se, paired_t, step_z, wilcoxon


def test_mean_se_is_the_sample_sd_over_root_n():
    # mean 2, deviations -1, 0, 1: sample variance 2 / 2 = 1, SE 1 / sqrt(3)
    assert mean_se([1, 2, 3]) == {"mean": 2.0, "se": pytest.approx(1 / np.sqrt(3)), "n": 3, "values": [1.0, 2.0, 3.0]}
    assert mean_se([5.0])["se"] is None and mean_se([])["n"] == 0


def test_paired_t_by_hand_and_against_scipy():
    d = [0.0333, -0.0055, 0.0181]  # the preset's three seeds (issue 50)
    mean = sum(d) / 3
    sd = np.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    t = paired_t(d)
    assert t["mean"] == pytest.approx(mean) and t["se"] == pytest.approx(sd / np.sqrt(3))
    assert t["t"] == pytest.approx(mean / (sd / np.sqrt(3))) and t["df"] == 2
    ref = stats.ttest_1samp(d, 0.0)
    assert t["t"] == pytest.approx(ref.statistic) and t["p"] == pytest.approx(ref.pvalue)
    assert t["p"] == pytest.approx(0.31, abs=0.005)
    one = paired_t(d, "greater")
    assert one["p"] == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue)
    assert one["p"] == pytest.approx(t["p"] / 2)  # t > 0: half the two-sided p
    neg = paired_t([-x for x in d], "greater")  # the wrong direction: p above 1/2
    assert neg["p"] == pytest.approx(1 - one["p"])
    rng = np.random.default_rng(0)
    for n in (4, 16):
        x = rng.normal(0.01, 0.02, n)
        for alt in ("two-sided", "greater"):
            assert paired_t(x, alt)["p"] == pytest.approx(stats.ttest_1samp(x, 0.0, alternative=alt).pvalue)
        assert paired_t(x)["df"] == n - 1


def test_paired_t_with_one_seed_or_no_spread_gives_no_p():
    assert paired_t([0.1])["p"] is None and paired_t([0.1])["df"] == 0
    assert paired_t([0.1, 0.1])["t"] is None


def exact_wilcoxon_by_enumeration(d, alternative):
    """W+ and its p, written out: zeros dropped, average ranks for ties, every sign pattern."""
    d = [x for x in d if x != 0]
    a = sorted(abs(x) for x in d)
    rank = {v: np.mean([i + 1 for i, w in enumerate(a) if w == v]) for v in a}
    ranks = [rank[abs(x)] for x in d]
    w = sum(r for r, x in zip(ranks, d) if x > 0)
    null = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(d))]
    upper = np.mean([v >= w - 1e-9 for v in null])
    lower = np.mean([v <= w + 1e-9 for v in null])
    return w, upper if alternative == "greater" else min(1.0, 2 * min(upper, lower))


@pytest.mark.parametrize("d", [
    [0.5, 1.2, -0.3, 2.0, 0.7],               # no ties, no zeros
    [1, -2, 2, 0, 3],                          # a tie and a zero
    [1, 1, -1, 2, 0, 0, 3, -3, 3],             # several ties and zeros
    [-0.1, -0.2, -0.3, 0.4],                   # mostly below 0
])
@pytest.mark.parametrize("alternative", ["greater", "two-sided"])
def test_wilcoxon_is_exact_with_ties_and_zeros(d, alternative):
    w = wilcoxon(d, alternative)
    w_ref, p_ref = exact_wilcoxon_by_enumeration(d, alternative)
    assert w["w_plus"] == pytest.approx(w_ref) and w["p"] == pytest.approx(p_ref)
    assert w["n"] == sum(x != 0 for x in d)
    # scipy: the exact permutation distribution (all 2^n sign patterns), zeros dropped ("wilcox")
    ref = stats.wilcoxon(d, alternative=alternative, method=stats.PermutationMethod())
    assert w["p"] == pytest.approx(ref.pvalue)


def test_wilcoxon_without_ties_matches_scipys_exact_method():
    d = [0.03, -0.005, 0.018, 0.011, -0.002, 0.027, 0.009]
    for alt in ("greater", "two-sided"):
        ref = stats.wilcoxon(d, alternative=alt, method="exact")
        assert wilcoxon(d, alt)["p"] == pytest.approx(ref.pvalue)
    assert wilcoxon(d, "greater")["w_plus"] == stats.wilcoxon(d, alternative="greater", method="exact").statistic
    # three of three ahead: one pattern in 8 is as extreme
    assert wilcoxon([0.03, 0.01, 0.02], "greater")["p"] == pytest.approx(1 / 8)
    assert wilcoxon([0.0, 0.0])["p"] is None


def test_last_third_is_the_last_len_over_3_steps():
    steps = list(range(1, 41))
    assert last_third(steps) == list(range(28, 41))  # steps 28-40 of a 40-step run: 13 steps
    assert last_third(list(range(1, 7))) == [5, 6]
    assert last_third([1, 2, 3]) == [3]
    assert last_third([1, 2]) == [1, 2] and last_third([]) == []


def test_step_z_pools_every_step_as_a_replicate():
    by_seed = [[0.01, 0.03], [0.02, 0.00, 0.04]]
    pooled = [0.01, 0.03, 0.02, 0.00, 0.04]
    z = step_z(by_seed)
    se = np.std(pooled, ddof=1) / np.sqrt(5)
    assert z["n"] == 5 and z["mean"] == pytest.approx(0.02) and z["se"] == pytest.approx(se)
    assert z["z"] == pytest.approx(0.02 / se) and z["unit"].startswith("step")


def test_icc_by_hand():
    # two datasets x two replicates: means 1 and 3 (MS between 2 * var([1, 3]) = 4), within variance 0.5
    x = [[0.5, 1.5], [2.5, 3.5]]
    assert icc(x) == pytest.approx((4 - 0.5) / (4 + 0.5))
    assert icc([[1.0], [2.0]]) is None
