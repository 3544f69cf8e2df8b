"""``dev/scripts/teacher_sim.py`` (the teacher's update against a synthetic, oracle-valued reward) on the
shipped world: ``--value-scale`` puts the values in other units, and ``explained_frac`` is the share
of the rewards' variance the values carry (all of it without noise).

Here rather than beside dev/scripts: the README's test command runs tests/, and docs/world.md's choice of g and n
rests on this script, so it is checked wherever the project's tests run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "dev" / "scripts" / "teacher_sim.py"
TINY = ["teacher.datasets=4", "teacher.questions_per_dataset=2"]


def sim(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"sim_{len(list(tmp_path.iterdir()))}.json"
    subprocess.run([sys.executable, str(SCRIPT), "--steps", "1", "--out", str(out), *args, "--", *TINY],
                   check=True, capture_output=True, timeout=300)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_value_scale_scales_the_values_and_without_noise_they_explain_the_rewards(tmp_path):
    nats = sim(tmp_path, "--noise", "0")
    scaled = sim(tmp_path, "--noise", "100", "--value-scale", "0.01")
    step, step_scaled = nats["history"][0], scaled["history"][0]
    # The first step samples before any update, so both runs see the same pairs; noise never enters the values.
    assert step["right"] == step_scaled["right"] and step["carries"] == step_scaled["carries"]
    assert step_scaled["true_value"] == pytest.approx(0.01 * step["true_value"])
    assert step["explained_frac"] == pytest.approx(1.0)
    assert step_scaled["explained_frac"] < 0.01
    assert scaled["value_scale"] == 0.01
