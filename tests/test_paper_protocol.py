"""The paper's evaluation protocol as the presets and the stages apply it (issue 49 §5): PQ/PS
eligibility, the slope rule under the curriculum, one hard split per hard set, the oracle pool
without hard-test, baseline and students scored in one layout, sample standard deviations."""

import json
from pathlib import Path

import numpy as np
import pytest

import soar

pytestmark = pytest.mark.timeout(600)


# ---- PQ / PS eligibility ----------------------------------------------------------------------------
def fake_run(tmp_path: Path, promotions: int):
    from soar.rundata import RunData

    return RunData(tmp_path, None, "0" * 16, [], [{"promotion": i + 1} for i in range(promotions)],
                   [{"id": f"q{i}", "promotion": i // 64 + 1} for i in range(64 * promotions)], [])


@pytest.mark.parametrize("preset", ["paper", "paper_math", "paper_harp"])
def test_paper_presets_make_two_promotions_eligible(preset, tmp_path):
    """The paper's PQ sizes {128, 192, 256} are 2, 3 and 4 promotions of 64 questions: a 2-promotion
    run is eligible for PQ and PS (both read ``pq.min_promotions``), a 1-promotion run is not."""
    from soar.rundata import RunDataError, check_eligible

    pq = soar.compose([f"experiment={preset}"]).pq
    assert pq.min_promotions == 2 and not pq.allow_ineligible
    assert check_eligible(fake_run(tmp_path, 2), pq, "evaluate") is True
    assert len(fake_run(tmp_path, 2).pq) == 128
    with pytest.raises(RunDataError, match="1 promotions"):
        check_eligible(fake_run(tmp_path, 1), pq, "evaluate")


# ---- the slope rule under the curriculum ---------------------------------------------------------
def curriculum_curve(seed: int, synthetic_steps: int = 64, steps: int = 600) -> np.ndarray:
    """A fresh student's training reward under curriculum mixing: a fast rise on the synthetic
    questions, a drop at the switch to hard-train, then a slow rise with its knee at step 300."""
    t = np.arange(1, steps + 1)
    noise = np.random.default_rng(seed).normal(0, 0.005, steps)
    synthetic = 0.2 + 0.6 / (1 + np.exp(-(t - 20) / 4))
    hard = 0.05 + 0.5 / (1 + np.exp(-(t - 300) / 20))
    return np.where(t <= synthetic_steps, synthetic, hard) + noise


def test_slope_rule_under_the_curriculum_runs_after_the_synthetic_phase():
    """Across the whole curve the steepest slope is the synthetic phase's and the rule stops there;
    from ``curriculum_steps`` + 1 on it stops after the hard-train knee (~3.2 widths past step 300)."""
    from omegaconf import OmegaConf

    from soar.evaluate import slope_rule, slope_rule_first_step

    cfg = soar.compose(["experiment=paper_math"])
    assert cfg.eval.mixing == "curriculum" and cfg.eval.curriculum_steps == 64
    first = slope_rule_first_step(cfg.eval, synthetic=["a question"])
    assert first == 65
    assert slope_rule_first_step(cfg.eval, synthetic=[]) == 1  # Hard-Only: no synthetic phase
    assert slope_rule_first_step(OmegaConf.merge(cfg.eval, {"mixing": "mixed"}), ["a question"]) == 1
    sr = cfg.eval.slope
    for seed in range(3):
        rewards = curriculum_curve(seed)
        whole = slope_rule(rewards, sr.window, sr.threshold, sr.fallback_step)
        assert whole.max_slope_step < 64 and whole.stop_step < 100, whole  # what the rule did before
        rule = slope_rule(rewards, sr.window, sr.threshold, sr.fallback_step, first)
        assert not rule.fallback and 280 <= rule.max_slope_step <= 320 and 355 <= rule.stop_step <= 375, rule
        assert rule.first_step == 65
    short = slope_rule(curriculum_curve(0, steps=80), sr.window, sr.threshold, None, first)  # 16 hard steps
    assert short.fallback and short.stop_step == 80 and "16 steps" in short.reason
