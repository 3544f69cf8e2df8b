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


def test_a_layout_projects_its_timeline_busy_fraction_and_allocated_gpu_hours():
    """``project_layout`` against a hand computation: 16 students of K = 2 on 8 GPUs are 2 students
    per GPU; the teacher's phases and the dump keep one GPU busy, the checkpoint none."""
    from soar.estimate import StepWork, project_layout

    work = StepWork(student_inner_s=10, student_eval_s=5, teacher_sample_s=20, teacher_update_s=10, checkpoint_s=4,
                    dump_s=6, baseline_eval_s=30)
    one_node = project_layout(work, gpus=8, students=16, inner_steps=2, steps=10, promotions=2)
    assert one_node["student_s"] == 25 and one_node["students_per_gpu"] == 2
    assert [(p["phase"], p["s"], p["busy_gpus"]) for p in one_node["timeline"]] == [
        ("teacher_sample", 20, 1), ("baseline_qr", 0.0, 1), ("students", 50, 8), ("teacher_update", 10, 1),
        ("dump", 6, 1), ("checkpoint", 4, 0)]
    assert one_node["step_s"] == 90 and one_node["step_busy_fraction"] == pytest.approx(436 / 720)
    # 10 steps, plus the baseline's pass at the start and after each of 2 promotions (3 x 30 s)
    assert one_node["wall_hours"] == pytest.approx(990 / 3600)
    assert one_node["allocated_gpu_hours"] == pytest.approx(8 * 990 / 3600)
    assert one_node["busy_fraction"] == pytest.approx((4360 + 90) / (8 * 990))

    # The driver's GPU kept out of the students: 16 students on 7 GPUs take 3 rounds, not 2.
    apart = project_layout(work, gpus=8, students=16, inner_steps=2, steps=10, promotions=2,
                           driver_trains_students=False)
    assert apart["students_per_gpu"] == 3 and apart["step_s"] == 115
    assert apart["allocated_gpu_hours"] > one_node["allocated_gpu_hours"]
    # More GPUs than students: half of 32 GPUs never train; the step is shorter, the GPU-hours higher.
    wide = project_layout(work, gpus=32, students=16, inner_steps=2, steps=10, promotions=2)
    assert wide["step_s"] == 65 and wide["step_busy_fraction"] == pytest.approx(436 / (32 * 65))
    assert wide["allocated_gpu_hours"] > one_node["allocated_gpu_hours"]
    with pytest.raises(ValueError, match="a layout needs a GPU for students"):
        project_layout(work, gpus=1, students=16, inner_steps=2, driver_trains_students=False)


def test_a_config_projects_on_its_own_layout_with_labelled_inputs(tmp_path):
    """``project_config``: the GPUs from the config's pool (the driver's apart or not), K growing by
    ``inner.steps_per_promotion`` after each of the promotions, one span each; every input says where it
    comes from, and an inputs file must too."""
    from soar.config import ConfigError
    from soar.estimate import COST_INPUTS, config_step_work, project_config, read_cost_inputs

    assert all(x.source.startswith(("measured:", "assumed:")) for x in COST_INPUTS.values())
    lora, full = (soar.compose([f"experiment={e}", "backend=vllm"], config_name="train")
                  for e in ("paper_math_lora", "paper_math"))
    flat, grown = project_config(lora, promotions=0), project_config(lora, promotions=3)
    full_run = project_config(full)
    assert (flat["gpus"], flat["driver_trains_students"], full_run["gpus"], full_run["driver_trains_students"]) == \
        (8, True, 8, False)  # 8 workers on 8 GPUs; 7 workers beside the driver's GPU kept apart
    assert [sp["K"] for sp in grown["spans"]] == [10, 15, 20, 20] and sum(sp["steps"] for sp in grown["spans"]) == 200
    assert grown["allocated_gpu_hours"] > flat["allocated_gpu_hours"]
    assert flat["allocated_gpu_hours"] == pytest.approx(8 * flat["spans"][0]["wall_hours"])
    work, inner = config_step_work(lora)
    assert work.student_inner_s == pytest.approx(inner["rollouts_s"] + inner["push_s"] + inner["train_s"])
    assert inner["push_s"] == COST_INPUTS["push_lora_s"].value  # adapters pushed into the worker's engine
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps({"vllm_tokens_per_s": {"value": 40000, "source": "measured: somewhere, today"}}))
    faster = project_config(lora, read_cost_inputs(path), promotions=0)
    assert faster["inputs"]["vllm_tokens_per_s"]["source"] == "measured: somewhere, today"
    assert faster["allocated_gpu_hours"] <= flat["allocated_gpu_hours"]
    path.write_text(json.dumps({"vllm_tokens_per_s": {"value": 40000}}))
    with pytest.raises(ConfigError, match="vllm_tokens_per_s needs a number 'value' and a 'source'"):
        read_cost_inputs(path)


def test_the_committed_layout_projection_is_what_the_script_writes(tmp_path):
    """benchmarks/results/layouts.json (docs/paper_setting.md's tables) is reproduced by benchmarks/layouts.py
    from the labelled inputs; every layout in it fits its GPUs, and the chosen one is the cheapest."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("layouts", repo / "benchmarks" / "layouts.py")
    layouts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layouts)
    fresh = layouts.main(["--out", str(tmp_path / "layouts.json")])
    committed = json.loads((repo / "benchmarks" / "results" / "layouts.json").read_text())
    assert json.loads(json.dumps(fresh)) == committed
    assert all(memory["fits"] for memory in committed["plans"].values())
    for regime in ("no_promotion", "promotions"):
        cost = {name: row[regime]["allocated_gpu_hours"] for name, row in committed["layouts"].items()}
        assert min(cost, key=cost.get) == committed["chosen"], cost


@pytest.mark.timeout(300)
def test_soar_estimate_layout_prints_the_projection():
    """``soar-estimate --layout``: the same projection as benchmarks/results/layouts.json, with its inputs' sources."""
    from pathlib import Path

    from conftest import REPO, run_cli, script

    res = run_cli([script("soar-estimate"), "--layout", "--promotions", "0", "experiment=paper_math_lora", "backend=vllm"],
                  cwd=REPO, timeout=240)
    out = json.loads(res.stdout[res.stdout.index("{"):])
    committed = json.loads((Path(REPO) / "benchmarks" / "results" / "layouts.json").read_text())
    chosen = committed["layouts"][committed["chosen"]]["no_promotion"]
    assert out["allocated_gpu_hours"] == pytest.approx(chosen["allocated_gpu_hours"], abs=1e-3)
    assert out["inputs"]["vllm_tokens_per_s"]["source"].startswith("assumed:")
