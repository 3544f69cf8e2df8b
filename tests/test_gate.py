"""The world gate's statistics (``dev/scripts/compare_teachers.py``) on hand-made runs, and its oracle
trajectories on a real step dump layout.

Here rather than beside dev/scripts: the README's test command runs tests/, and docs/results.md cites the gate's
numbers from this script, so its statistics are checked wherever the project's tests run."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "dev" / "scripts"
spec = importlib.util.spec_from_file_location("compare_teachers", SCRIPTS / "compare_teachers.py")
gate_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gate_script)


def runs_with(gt: dict, bt: dict, promotions=None) -> dict:
    out = {}
    for s in gt:
        out[f"grounded_s{s}"] = {"rewards": gt[s], "promotions": (promotions or {}).get(s, 0)}
        out[f"base_s{s}"] = {"rewards": bt[s], "promotions": 0}
    return out


def test_last_third_is_the_final_third_of_the_steps():
    assert gate_script.last_third(list(range(40))) == list(range(27, 40))
    assert gate_script.last_third([1.0, 2.0]) == [1.0, 2.0]


def test_gate_takes_the_seed_as_the_unit_and_passes_on_a_one_sided_paired_t():
    from scipy import stats

    rng = np.random.default_rng(0)
    bt = {s: list(rng.normal(0, 1, 30)) for s in range(3)}
    lift = {0: 1.0, 1: 1.2, 2: 0.8}
    better = {s: [x + lift[s] for x in bt[s]] for s in range(3)}  # every seed ahead, by different amounts
    res = gate_script.gate(runs_with(better, bt, {0: 1, 1: 1, 2: 0}), [0, 1, 2])
    assert res["gt_minus_bt_last_third"] == pytest.approx(lift)
    t = res["paired_t"]
    ref = stats.ttest_1samp([1.0, 1.2, 0.8], 0.0, alternative="greater")
    assert (t["n"], t["df"]) == (3, 2) and t["t"] == pytest.approx(ref.statistic) and t["p"] == pytest.approx(ref.pvalue)
    assert res["passes_reward_gate"] == (ref.pvalue < 0.05) and res["pass_rule"]["false_positive_rate"] == 0.05
    assert res["wilcoxon"]["w_plus"] == 6.0 and res["wilcoxon"]["p"] == pytest.approx(1 / 8)  # 3 of 3 up: 1 pattern of 8
    z = res["step_level_z_not_independent"]
    assert z["n"] == 30 and z["z"] == pytest.approx(np.mean([1.0] * 10 + [1.2] * 10 + [0.8] * 10) / z["se"])
    assert res["old_rule"]["passes"]  # 3 of 3 ahead and a step-level z far above 2
    assert res["passes_promotion_gate"] and res["seeds_with_promotion"] == 2
    assert res["base_promotions"] == {0: 0, 1: 0, 2: 0} and res["seeds_promotions_differ"] == [0, 1]


def test_one_seed_far_ahead_passes_the_old_rule_but_not_the_seed_level_test():
    """Two seeds a little ahead and one far ahead: the step-pooled z is large (steps count as
    replicates), the paired t over 3 seeds is not significant."""
    bt = {s: [0.0] * 30 for s in range(3)}
    lifts = {0: 0.001, 1: 0.002, 2: 0.05}
    rng = np.random.default_rng(1)
    gt = {s: list(lifts[s] + rng.normal(0, 0.001, 30)) for s in range(3)}
    res = gate_script.gate(runs_with(gt, bt), [0, 1, 2])
    assert res["old_rule"]["passes"] and res["step_level_z_not_independent"]["z"] > 2
    assert not res["passes_reward_gate"] and res["paired_t"]["p"] > 0.05
    assert not res["passes_promotion_gate"]
    behind = {0: [x - 1.0 for x in bt[0]], 1: [x - 1.0 for x in bt[1]], 2: [x + 1.0 for x in bt[2]]}
    res = gate_script.gate(runs_with(behind, bt), [0, 1, 2])
    assert not res["passes_reward_gate"] and not res["old_rule"]["passes"]  # 1 of 3 seeds ahead


def test_teacher_trajectory_reads_the_step_dumps_through_the_oracle(tmp_path):
    steps = tmp_path / "steps"
    steps.mkdir()
    questions = [{"question": "999+001", "answer": "0001"},   # 999 + 100 = 1099: wrong, 1 carry
                 {"question": "100+200", "answer": "3000"},   # 1 + 2 = 3: right, no carry
                 {"question": "990+010", "answer": "9010"}]   # 99 + 10 = 109: right, 1 carry
    from soar.worlds.arith import carries_of, oracle_answer, parse_question

    (steps / "step_000001.json").write_text(json.dumps({"datasets": [{"questions": questions}]}))
    traj = gate_script.teacher_trajectory(tmp_path, stepping=[1])
    right = [oracle_answer(q["question"]) == q["answer"] for q in questions]
    carries = [carries_of(*parse_question(q["question"])) for q in questions]
    assert traj["answer_correct_frac"] == [pytest.approx(np.mean(right))]
    assert traj["s_like_frac"] == [pytest.approx(np.mean([c == 1 for c in carries]))]
    assert traj["s_like_correct_frac"] == [pytest.approx(np.mean([c == 1 and r for c, r in zip(carries, right)]))]
    assert traj["beyond_s_correct_frac"] == [0.0]   # nothing above 1 carry here
    assert gate_script.teacher_trajectory(tmp_path, stepping=[0])["beyond_s_correct_frac"] == [pytest.approx(1 / 3)]
    assert traj["carries_mean"] == [pytest.approx(np.mean(carries))]


def test_reward_follows_answers_is_the_within_step_correlation(tmp_path):
    """Rewards that are the right-answer fraction plus a per-step offset correlate perfectly within
    steps (r = 1, slope 1) although the offsets hide it across steps; a reversed step lowers r."""
    steps = tmp_path / "steps"
    steps.mkdir()
    right, wrong = {"question": "100+200", "answer": "3000"}, {"question": "100+200", "answer": "4000"}

    def dump(step, rewards_and_right):
        datasets = [{"reward": r, "questions": [right] * k + [wrong] * (4 - k)} for r, k in rewards_and_right]
        (steps / f"step_{step:06d}.json").write_text(json.dumps({"datasets": datasets}))

    dump(1, [(10.25, 1), (10.5, 2), (10.75, 3)])
    dump(2, [(-5.0, 0), (-4.5, 2), (-4.0, 4)])
    res = gate_script.reward_follows_answers(tmp_path)
    assert res["r"] == pytest.approx(1.0) and res["slope"] == pytest.approx(1.0) and res["datasets"] == 6
    dump(3, [(1.0, 0), (0.0, 4)])
    assert gate_script.reward_follows_answers(tmp_path)["r"] < 0.9
