"""``soar-estimate``: one calibration step of ``experiment=arith_micro`` (hard set built on the way)
projects a full run whose bounds are ordered, add up, and follow ``inner.max_steps``."""

import json

import pytest

import soar
from soar.estimate import TOTAL_KEYS, estimate, project


@pytest.mark.timeout(300)
def test_one_calibration_step_projects_a_consistent_full_run(tiny_model_dir, tmp_path):
    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", "run.threads=1",
                        "run.progress=false"])
    result = estimate(cfg, calibration_steps=1, run_dir=tmp_path / "calibration")
    cal, proj = result["calibration"], result["projection"]
    knobs = {"g": 2, "n": 8, "r": 2, "K": 2, "K_max": 4, "M": 8, "steps": 3}
    assert {k: result["config"][k] for k in knobs} == knobs
    assert cal["hard_set"] == str((tmp_path / "calibration" / "hard_set").resolve()) and cal["hard_set_built"]
    assert cal["hard_set_s"] > 0

    # Every phase the loop timed, and the step time it leaves out, is in the per-step breakdown.
    rows = [json.loads(line) for line in (tmp_path / "calibration" / "metrics.jsonl").read_text().splitlines()]
    logged = {k[len("time/"):-2] for k in rows[0] if k.startswith("time/") and k not in TOTAL_KEYS}
    phases = proj["per_step"]["phases_s"]
    assert logged >= {"teacher_sample", "baseline_eval", "rewards", "teacher_update"}
    assert set(phases) == logged | {"other"}
    assert phases["baseline_eval"] == proj["baseline_eval_s"] == rows[0]["time/baseline_eval_s"] > 0  # every step (Q_R)
    assert proj["per_step"]["compute"]["compute/student_steps"] == 2 * 2 * 2  # g * r * K

    # total = hard set + one-off costs + loop.steps x step time; low (K=2) <= high (K = inner.max_steps = 4).
    assert proj["K"] == {"low": 2, "high": 4} and proj["max_promotions"] == 1  # 3 steps, window 2, reset
    for bound in ("low", "high"):
        expected = cal["hard_set_s"] + proj["one_off_s"][bound] + 3 * proj["step_s"][bound]
        assert proj["total_s"][bound] == pytest.approx(expected, rel=1e-9)
        assert proj["total_hours"][bound] == pytest.approx(proj["total_s"][bound] / 3600)
    assert proj["step_s"]["low"] == pytest.approx(sum(phases.values()))
    assert proj["step_s"]["high"] == pytest.approx(proj["step_s"]["low"] + phases["rewards"])  # K 2 -> 4: rewards x2
    assert proj["total_s"]["low"] < proj["total_s"]["high"]
    assert proj["compute_totals"]["compute/student_steps"] == {"low": 3 * 8, "high": 3 * 16}

    # More room for K raises only the high bound; without promotions K cannot grow at all.
    wider = project(cal, soar.compose(["experiment=arith_micro", "inner.max_steps=8"]))
    assert wider["total_s"]["low"] == pytest.approx(proj["total_s"]["low"])
    assert wider["total_s"]["high"] > proj["total_s"]["high"]
    frozen = project(cal, soar.compose(["experiment=arith_micro", "promotion.enabled=false"]))
    assert frozen["total_s"]["low"] == pytest.approx(frozen["total_s"]["high"]) and frozen["max_promotions"] == 0
