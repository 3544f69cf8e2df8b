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
