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
    with pytest.raises(RunDataError, match="1 promotion "):
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


# ---- one hard split per hard set ----------------------------------------------------------------------
def filtered_pool(tmp_path: Path, filter_seed: int = 7, n: int = 24):
    """A question pool and what ``soar-filter`` (seed ``filter_seed``) writes for it: the manifest
    (every third problem solved once, the rest 0/2) and the hard split (``build_hard_set``)."""
    from soar.data import Problem, write_jsonl
    from soar.filters.failk import build_hard_set

    problems = [Problem(f"p{i:02d}", f"{i} + {i}", str(2 * i)) for i in range(n)]
    pool = tmp_path / "pool.jsonl"
    write_jsonl(pool, [{"id": p.id, "question": p.question, "answer": p.answer} for p in problems])
    out = tmp_path / "filter"
    out.mkdir()
    cfg = soar.compose(["experiment=paper", f"data.path={pool}", f"seed={filter_seed}", "filter.k=2"])
    provenance = {"model": "m", "template_sha": "t", "sampling": {}, "seed": filter_seed, "k": 2, "grader": "math_verify"}
    rows = {p.id: {"id": p.id, "batch": i // 4, "outcomes": [0, int(i % 3 == 0)], "passes": int(i % 3 == 0),
                   "overflow": 0, **provenance} for i, p in enumerate(problems)}
    write_jsonl(out / "manifest.jsonl", list(rows.values()))
    summary = build_hard_set(problems, rows, cfg, out, provenance, {})
    written = [[json.loads(line)["id"] for line in (out / f"hard_{s}.jsonl").read_text().splitlines()]
               for s in ("train", "test")]
    return pool, out, summary, written


def hard_ids(split):
    return [[p.id for p in problems] for problems in split[:2]]


def test_runs_of_any_seed_given_one_manifest_get_its_one_split(tmp_path):
    """Runs of seeds 0 and 1 given one manifest get the same split, the one ``soar-filter`` wrote for
    it (drawn with the filter's seed, which the manifest records); the run dir keeps it on record."""
    from soar.filters.failk import split_hard
    from soar.prepare import given_hard_set

    pool, out, summary, written = filtered_pool(tmp_path)
    assert summary["split"] == {"seed": 7, "test_frac": 0.5} and summary["hard"] == 16
    assert written == [list(s) for s in split_hard([f"p{i:02d}" for i in range(24) if i % 3], 0.5, 7)]
    for seed in (0, 1):
        run = tmp_path / f"run_{seed}"
        cfg = soar.compose(["experiment=paper", f"data.path={pool}", f"seed={seed}",
                            f"loop.hard_set={out / 'manifest.jsonl'}"])
        assert hard_ids(given_hard_set(cfg, run)) == written, seed
        recorded = [[json.loads(line)["id"] for line in (run / "hard_set" / f"hard_{s}.jsonl").read_text().splitlines()]
                    for s in ("train", "test")]
        assert recorded == written
    assert [list(s) for s in split_hard(written[0] + written[1], 0.5, 0)] != written  # a run seed's split differs


def test_a_manifest_recording_no_seed_is_split_with_seed_0_for_every_run(tmp_path):
    from soar.filters.failk import UNRECORDED_SPLIT_SEED, split_hard
    from soar.prepare import given_hard_set

    pool, out, _, _ = filtered_pool(tmp_path)
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    bare = tmp_path / "bare.jsonl"  # a manifest written before rows carried their provenance
    bare.write_text("".join(json.dumps({k: r[k] for k in ("id", "outcomes", "passes")}) + "\n" for r in rows))
    hard = sorted(r["id"] for r in rows if r["passes"] == 0)
    expected = [list(s) for s in split_hard(hard, 0.5, UNRECORDED_SPLIT_SEED)]
    for seed in (0, 3):
        cfg = soar.compose(["experiment=paper", f"data.path={pool}", f"seed={seed}", f"loop.hard_set={bare}"])
        assert hard_ids(given_hard_set(cfg)) == expected
    rows[5]["seed"] = 8  # two filter runs' rows in one manifest: which split is meant?
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = soar.compose(["experiment=paper", f"data.path={pool}", f"loop.hard_set={tmp_path / 'mixed.jsonl'}"])
    with pytest.raises(soar.ConfigError, match=r"loop.hard_set: .*mixed.jsonl: row 6: field 'seed' is 8 but row 1 has 7"):
        given_hard_set(cfg)


def test_a_resumed_run_and_its_evaluation_keep_the_split_it_started_with(tmp_path):
    """A run dir that records a split (e.g. derived from the run's seed before this fix) keeps it on
    resume, and ``soar-eval`` of that run reads it too: its hard-test stays the one it never trained on."""
    from soar.data import write_jsonl
    from soar.evaluate import load_hard_split
    from soar.prepare import hard_set
    from soar.rundata import RunData

    pool, out, _, written = filtered_pool(tmp_path)
    old_train, old_test = written[0][:-2] + written[1][:2], written[1][2:] + written[0][-2:]
    run = tmp_path / "run"
    (run / "hard_set").mkdir(parents=True)
    rows = {json.loads(line)["id"]: json.loads(line) for line in pool.read_text().splitlines()}
    for name, ids in (("train", old_train), ("test", old_test)):
        write_jsonl(run / "hard_set" / f"hard_{name}.jsonl", [rows[i] for i in ids])
    cfg = soar.compose(["experiment=paper", f"data.path={pool}", f"loop.hard_set={out / 'manifest.jsonl'}",
                        "inner.reward_questions=4"])
    h = hard_set(cfg, run, None, None)
    assert [[p.id for p in h.train], [p.id for p in h.test]] == [old_train, old_test]
    eval_cfg = soar.compose(["experiment=paper", f"data.path={pool}"])
    trained = RunData(run, cfg, "0" * 16, [], [], [])
    assert hard_ids(load_hard_split(eval_cfg, trained)) == [old_train, old_test]
    # without a run, eval.hard_set (any form) is split as soar-train splits it
    eval_cfg = soar.compose(["experiment=paper", f"data.path={pool}", "seed=5", f"eval.hard_set={out / 'manifest.jsonl'}"])
    assert hard_ids(load_hard_split(eval_cfg, None)) == written


# ---- the oracle pool --------------------------------------------------------------------------------
def test_the_oracle_pool_leaves_out_hard_test(tmp_path):
    """Oracle rows train on real questions; any that is a hard-test problem, by id or by question
    (e.g. a MATH train problem repeated in the test split under another id), is left out."""
    from soar.data import Problem, write_jsonl
    from soar.evaluate import synthetic_questions

    hard_test = [Problem(f"test/{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(4)]
    pool = [{"id": f"train/{i}", "question": f"What is {i} * 3?", "answer": str(3 * i)} for i in range(6)]
    pool += [{"id": "test/0", "question": "What is 0 + 0?", "answer": "0"},  # the same id
             {"id": "train/dup", "question": "What  is 1 +\n1?", "answer": "2"}]  # the same question, respaced
    write_jsonl(tmp_path / "oracle.jsonl", pool)
    cfg = soar.compose(["experiment=paper", "eval.method=oracle", f"eval.oracle_path={tmp_path / 'oracle.jsonl'}",
                        "eval.oracle_size=100"])
    drawn, notes = synthetic_questions(cfg, None, hard_test)
    assert sorted(p.id for p in drawn) == [f"train/{i}" for i in range(6)]
    assert notes["oracle_excluded_hard_test"] == 2 and notes["oracle_pool"] == 6
    write_jsonl(tmp_path / "all_test.jsonl", pool[6:])
    with pytest.raises(soar.ConfigError, match="eval.oracle_path: every question of .*all_test.jsonl is in hard-test"):
        synthetic_questions(soar.compose(["experiment=paper", "eval.method=oracle",
                                          f"eval.oracle_path={tmp_path / 'all_test.jsonl'}"]), None, hard_test)


# ---- standard deviations over seeds ---------------------------------------------------------------
def test_reported_sds_over_seeds_are_sample_sds(tmp_path):
    """Mean ± SD per label uses the sample SD (ddof 1), as does every SE built from it; one seed
    has no SD (None in JSON, – in the table), never a 0 that reads as certainty."""
    from soar.eval_tables import aggregate, markdown_table
    from soar.stats import sample_sd

    values = {"PQ": [0.1, 0.2, 0.6], "Hard-Only": [0.3]}
    dirs = []
    for label, xs in values.items():
        for seed, x in enumerate(xs):
            d = tmp_path / f"{label}_{seed}"
            d.mkdir()
            (d / "eval.json").write_text(json.dumps({"label": label, "seed": seed,
                                                     "selected": {"eval/pass@1": x, "eval/greedy_acc": x / 2}}))
            dirs.append(d)
    table = aggregate(dirs)["table"]
    pq = table["PQ"]["metrics"]["eval/pass@1"]
    assert pq["mean"] == pytest.approx(0.3) and pq["sd"] == pytest.approx(np.sqrt(0.07))  # ddof 0 gave sqrt(0.14/3)
    assert pq["sd"] == pytest.approx(float(np.std(values["PQ"], ddof=1)))
    assert table["Hard-Only"]["metrics"]["eval/pass@1"]["sd"] is None
    md = markdown_table({"table": table})
    assert "| PQ | 3 | 15.0 ± 13.2 | 30.0 ± 26.5 |" in md and "| Hard-Only | 1 | 15.0 ± – | 30.0 ± – |" in md
    assert sample_sd([1.0, 3.0]) == pytest.approx(np.sqrt(2)) and sample_sd([1.0]) is None


# ---- the baseline scored in the students' layout ------------------------------------------------
def mixed_length_hard_set(path: Path) -> Path:
    """40 hard-train problems of 1 and 2 digits but one of 3, which step 1's Q_R (seed 0) leaves out,
    and 8 hard-test ones: a pass over hard train pads every row to the 3-digit problem's length, the
    Q_R batch to a shorter one, and padding changes the numerics of every row."""
    from soar.data import write_jsonl
    from soar.loop import draw_reward_questions
    from soar.seeding import derive_seed
    from soar.worlds.arith import generate_problems

    train = [p for d in (1, 2) for p in generate_problems(d, 0, 20, seed=d, prefix=f"d{d}")]
    outside = min(set(range(40)) - set(draw_reward_questions(40, 8, derive_seed(0, "reward_questions", 0))))
    train[outside] = generate_problems(3, 0, 1, seed=3, prefix="d3")[0]
    test = generate_problems(2, 0, 8, seed=4, prefix="test")
    write_jsonl(path, [{**p.to_dict(), "meta": json.dumps(p.meta), "split": split}
                       for split, problems in (("train", train), ("test", test)) for p in problems])
    return path


@pytest.mark.parametrize("metric, dtype", [("gold_prob", "float32"), ("accuracy", "bfloat16")])
def test_an_unchanged_student_gets_a_reward_of_exactly_0(tiny_model_dir, tmp_path, metric, dtype):
    """Students at lr 1e-30 (no weight moves: checked on the promoted one) score on Q_R exactly as the
    baseline does, so every R_{k,j} is 0.0, not a layout's rounding. Scored as a slice of one pass over
    hard train (``mixed_length_hard_set``), the baseline's gold log-probs differ from the students' in
    the 6th digit on CPU in fp32 (by up to 0.03 in bf16; greedy answers flip more rarely)."""
    import torch
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    soar.train(soar.compose([
        "experiment=arith_micro", f"model.path={tiny_model_dir}", f"run.dir={run_dir}", "run.threads=1",
        "run.progress=false", "loop.diversity_model=null", f"loop.hard_set={mixed_length_hard_set(tmp_path / 'hard.jsonl')}",
        "loop.steps=1", "student.lr=1e-30", f"inner.reward_metric={metric}", f"model.dtype={dtype}",
        "promotion.window=1"]))  # tau -1: the step's median student of the best dataset is promoted, kept on disk
    dump = json.loads((run_dir / "steps" / "step_000001.json").read_text())
    rewards = [r for d in dump["datasets"] for r in d["replicate_rewards"]]
    assert len(rewards) == 4 and rewards == [0.0] * 4, rewards
    base = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    promoted = load_file(str(run_dir / dump["promotion"]["path"] / "model.safetensors"))
    assert all(torch.equal(promoted[k].float(), base[k].to(getattr(torch, dtype)).float()) for k in base)
