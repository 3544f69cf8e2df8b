"""dev/confirm/analyze.py on a small committed sample (tests/data/confirm_sample): three seeds of
``experiment=arith_micro`` (loop.steps=6, inner.reward_metric=gold_prob as in the preset), Grounded-T and
Base-T (teacher.frozen=true), each packed by dev/confirm/pack.py, with fresh students (soar-eval, 4 steps;
seeds 0 and 2) and the paired reading (after_promotion.py --against); how it was made is in its README.md.
Its numbers are checked against a computation written out here from the sample's own files.

Here rather than beside dev/confirm: the README's test command runs tests/, and the confirmation's verdict is
a claim the README and docs/results.md make, so its analysis is checked wherever the project's tests run."""

import gzip
import hashlib
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tests" / "data" / "confirm_sample"
ANALYZE = REPO / "dev" / "confirm" / "analyze.py"
SEEDS = [0, 1, 2]


def analyze(tmp_path, *extra):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ANALYZE), "--raw", str(SAMPLE), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    return proc, out


def last_third_mean(variant, seed):
    with gzip.open(SAMPLE / f"{variant}_s{seed}" / "metrics.jsonl.gz", "rt") as fh:
        rewards = [json.loads(line)["teacher/reward_mean"] for line in fh if line.strip()]
    assert len(rewards) == 6
    return sum(rewards[4:]) / 2  # steps 5 and 6: the last third of 6


def pass32(row, seed, key):
    return json.loads((SAMPLE / "fresh" / f"{row}_s{seed}" / "eval.json").read_text())[key]["eval/pass@32"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    proc, out = analyze(tmp_path_factory.mktemp("confirm"), "--seeds", *map(str, SEEDS), "--steps", "6",
                        "--allow-partial")
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_primary_is_a_one_sided_paired_t_over_the_seeds(result):
    res, printed = result
    d = [last_third_mean("grounded", s) - last_third_mean("base", s) for s in SEEDS]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    t = mean / (sd / math.sqrt(3))
    p = stats.t.sf(t, 2)  # one-sided, Grounded-T above Base-T
    got = res["primary"]["paired_t"]
    assert [res["primary"]["per_seed"][str(s)]["difference"] for s in SEEDS] == pytest.approx(d)
    assert got["mean"] == pytest.approx(mean) and got["se"] == pytest.approx(sd / math.sqrt(3))
    assert got["t"] == pytest.approx(t) and got["df"] == 2 and got["p"] == pytest.approx(p)
    assert res["primary"]["passes"] == (p < 0.05)
    assert res["primary"]["grounded_ahead"] == sum(x > 0 for x in d)
    # the printed line carries the same numbers
    assert f"{mean:+.4f} +- {sd / math.sqrt(3):.4f} (n 3), t {t:.2f}, df 2, one-sided p {p:.3g}" in printed
    assert ("PASS" if p < 0.05 else "FAIL") in printed


def test_wilcoxon_is_the_exact_signed_rank_over_the_seeds(result):
    res, _ = result
    d = [last_third_mean("grounded", s) - last_third_mean("base", s) for s in SEEDS]
    order = sorted(range(3), key=lambda i: abs(d[i]))
    rank = {i: r + 1 for r, i in enumerate(order)}  # no ties among three real-valued differences
    w = sum(rank[i] for i in range(3) if d[i] > 0)
    null = [sum(r for r, s in zip(range(1, 4), signs) if s) for signs in itertools.product([0, 1], repeat=3)]
    assert res["primary"]["wilcoxon"]["w_plus"] == pytest.approx(w)
    assert res["primary"]["wilcoxon"]["p"] == pytest.approx(sum(v >= w for v in null) / 8)


def test_secondary_readings_by_seed(result):
    res, _ = result
    sec = res["secondary"]
    paired_seeds = [s for s in SEEDS if (SAMPLE / f"paired_s{s}.json").exists()]
    assert paired_seeds, "the sample holds no paired reading"
    paired = [json.loads((SAMPLE / f"paired_s{s}.json").read_text())["against"]["as_written_minus_against"]
              ["gold_prob"]["mean"] for s in paired_seeds]  # the preset's reward metric
    assert sec["a_paired_reading"]["test"]["values"] == pytest.approx(paired)
    assert sec["a_paired_reading"]["test"]["mean"] == pytest.approx(sum(paired) / len(paired))
    for (a, b), got in [(("Grounded-T", "Base-T"), sec["b_teacher_questions"]),
                        (("SOAR-PQ", "Base-T_PQ"), sec["c_promotion_questions"]["SOAR-PQ - Base-T PQ"])]:
        both = [s for s in SEEDS if all((SAMPLE / "fresh" / f"{r}_s{s}" / "eval.json").exists() for r in (a, b))]
        assert len(both) >= 2, f"the sample holds {a} and {b} students for {both} only"
        for reading, key in (("fixed_step", "fixed"), ("slope_rule", "selected")):
            diffs = [pass32(a, s, key) - pass32(b, s, key) for s in both]
            assert got[reading]["seeds"] == both
            assert got[reading]["difference"]["values"] == pytest.approx(diffs)
            if len(set(diffs)) > 1:  # two-sided, as analyze.py reports the secondary readings
                assert got[reading]["difference"]["p"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue)
            else:  # no spread: no t and no p
                assert got[reading]["difference"]["p"] is None


def test_provenance_is_reported(result):
    res, _ = result
    assert res["seeds"] == SEEDS and len(res["hard_set_sha256"]) == 1
    assert res["hard_set_sha256"][0] == json.loads((SAMPLE / "grounded_s0" / "provenance.json").read_text())[
        "hard_set_sha256"]


def test_no_interim_looks_and_the_protocols_steps(tmp_path):
    # a registered seed that is not packed: refused without --allow-partial
    proc, out = analyze(tmp_path, "--seeds", "0", "1", "2", "3", "--steps", "6")
    assert proc.returncode != 0 and "no interim looks" in proc.stderr and not out.exists()
    # runs shorter than the protocol's 40 steps: refused
    proc, out = analyze(tmp_path, "--seeds", "0", "1", "2", "--allow-partial")
    assert proc.returncode != 0 and "the protocol's 40" in proc.stderr and not out.exists()


CONFIRM = REPO / "dev" / "confirm"


@pytest.mark.skipif(not (CONFIRM / "results.json").exists(), reason="the confirmation is not finished "
                    "(dev/confirm/results.json does not exist yet; `run.py --analyze` writes it)")
def test_the_committed_result_is_the_registered_analysis():
    """dev/confirm/results.json came from ``analyze.py`` with its defaults (recorded by ``run.py --analyze``),
    covers every registered seed, and its t is the paired t of its own per-seed differences."""
    record = json.loads((CONFIRM / "analysis.json").read_text())
    results = (CONFIRM / "results.json").read_bytes()
    assert record["command"] == "python dev/confirm/analyze.py" and record["arguments"] == []
    assert record["results_sha256"] == hashlib.sha256(results).hexdigest()
    res = json.loads(results)
    sys.path.insert(0, str(CONFIRM))
    from run import protocol, seeds

    assert res["seeds"] == seeds(protocol()) and len(res["seeds"]) == len(protocol()["seeds"])
    d = [res["primary"]["per_seed"][str(s)]["difference"] for s in res["seeds"]]
    n, mean = len(d), sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    assert res["primary"]["paired_t"]["t"] == pytest.approx(mean / se)
    assert res["primary"]["paired_t"]["p"] == pytest.approx(stats.t.sf(mean / se, n - 1))
