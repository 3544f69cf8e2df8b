"""The two pre-registered team studies (dev/studies/team_scr, team_mappa): their protocols compose into valid
``soar-team`` configs, every arm's baseline is an arm, and the shared analysis reads a constructed raw sample
exactly (means, paired differences by seed) and refuses partial data or runs of two world models."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

import soar
from soar.team.checks import validate_team

from conftest import REPO

STUDIES = REPO / "dev" / "studies"
sys.path.insert(0, str(STUDIES))

from common import load_protocol  # noqa: E402  (dev/studies/common.py)
from team_study import analyze, team_args  # noqa: E402  (dev/studies/team_study.py)


@pytest.mark.parametrize("study", ["team_scr", "team_mappa"])
def test_protocol_arms_are_valid_configs(study):
    proto = load_protocol(STUDIES / study)
    assert len(proto["seeds"]) >= 5 and proto["readout_step"] == soar.compose([proto["preset"]]).student.max_steps
    assert set(proto["baselines"]) <= set(proto["arms"]) and set(proto["baselines"].values()) <= set(proto["arms"])
    for arm, overrides in proto["arms"].items():
        cfg = soar.compose([proto["preset"], *proto["common_overrides"], *overrides])
        validate_team(cfg)
        episodes = cfg.student.max_steps * cfg.student.questions_per_step * cfg.student.group_size
        assert episodes == 6400, (arm, episodes)  # budgets matched in episodes
        if overrides:
            assert team_args(proto, arm, 3, Path("/x"), Path("/w"))[-len(overrides):] == overrides


@pytest.mark.parametrize("study", ["team_scr", "team_mappa"])
def test_toy_protocol_is_the_same_pipeline_on_the_micro_world(study):
    """``run.py --toy``: every arm of the registered study, on the tests' micro team world model, read out at its
    last step (never data)."""
    proto, toy = load_protocol(STUDIES / study), load_protocol(STUDIES / study, toy=True)
    assert toy["arms"] == proto["arms"] and toy["baselines"] == proto["baselines"]
    assert (REPO / toy["world_model_dir"] / "train_info.json").exists()
    for overrides in toy["arms"].values():
        cfg = soar.compose([toy["preset"], *toy["common_overrides"], *overrides])
        validate_team(cfg)
        assert cfg.student.max_steps == toy["readout_step"]


def write_run(raw: Path, name: str, value: float, identity: str = "sha256:abc", step: int = 200) -> None:
    folder = raw / name
    folder.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy_after": 0.0},
            {"step": step, "eval/accuracy_after": value, "team/tokens_per_episode": 50.0}]
    with gzip.open(folder / "metrics.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "meta.json").write_text(json.dumps({"model": {"identity": identity}}))
    (folder / "summary.json").write_text("{}")


def test_analysis_by_hand_and_refusals(tmp_path):
    proto = load_protocol(STUDIES / "team_mappa")
    raw = tmp_path / "raw"
    # every arm's value = its index / 10 + seed / 100: each arm minus its baseline is the same for every seed
    index = {arm: i for i, arm in enumerate(proto["arms"])}
    for arm in proto["arms"]:
        for seed in proto["seeds"][:-1]:
            write_run(raw, f"{arm}_s{seed}", index[arm] / 10 + seed / 100)
    with pytest.raises(SystemExit, match="partial"):
        analyze(proto, raw)
    partial = analyze(proto, raw, allow_partial=True)
    assert partial["partial"] and len(partial["missing"]) == len(proto["arms"])
    for arm in proto["arms"]:
        write_run(raw, f"{arm}_s{proto['seeds'][-1]}", index[arm] / 10 + proto["seeds"][-1] / 100)
    out = analyze(proto, raw)
    seeds = proto["seeds"]
    assert out["arms"]["process"]["primary"]["mean"] == pytest.approx(sum(s / 100 for s in seeds) / len(seeds))
    diff = out["comparisons"]["process - outcome_only"]
    assert diff["mean"] == pytest.approx((index["process"] - index["outcome_only"]) / 10) and diff["n"] == len(seeds)
    assert out["arms"]["biased"]["secondary"]["team/tokens_per_episode"]["mean"] == 50.0
    other = raw / f"biased_s{seeds[0]}"
    (other / "meta.json").write_text(json.dumps({"model": {"identity": "sha256:other"}}))
    with pytest.raises(SystemExit, match="world models"):
        analyze(proto, raw)
