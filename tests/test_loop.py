"""The SOAR outer loop end to end (``soar-train experiment=arith_micro``, real subprocesses): what a
run writes, and SIGKILL at fixed phases and at a random moment followed by resume, compared with an
uninterrupted run byte for byte (PQ, promotion log) and value for value (metrics without time/*)."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import run_cli, script

pytestmark = pytest.mark.timeout(900)


def micro_args(model_dir, run_dir, *extra):
    return [script("soar-train"), "experiment=arith_micro", f"model.path={model_dir}", f"run.dir={run_dir}",
            "run.threads=1", "run.progress=false", *extra]


def comparable_metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.fixture(scope="module")
def reference_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("loop") / "reference"
    t0 = time.perf_counter()
    res = run_cli(micro_args(tiny_model_dir, run_dir), timeout=300)
    return run_dir, res, time.perf_counter() - t0


def test_micro_run_writes_metrics_checkpoints_pq_and_promotes_once(reference_run):
    run_dir, res, seconds = reference_run
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["promotions"] == 1 and summary["pq_size"] == 8
    rows = comparable_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # tau=-1 with a 2-step window: the first full window (step 2) promotes, then the window resets.
    assert [r["promotion/promoted"] for r in rows] == [0, 1, 0]
    assert [r["student/inner_steps"] for r in rows] == [2, 2, 3]  # K grows by +1 (preset) after a promotion
    assert rows[0]["promotion/moving_average"] is None  # partial window
    for r in rows:
        assert 0 < r["teacher/valid_frac"] <= 1 and r["teacher/attempts"] >= 16
        assert 0 <= r["teacher/answer_correct_frac"] <= 1
        assert r["compute/student_steps"] == 2 * 2 * r["student/inner_steps"]  # g * r * K
        assert 0 <= r["diversity/pairwise_cosine_distance"] <= 2 and r["diversity/vendi"] >= 1
        assert "teacher/pg_loss" in r and "teacher/skipped_zero_adv" in r
    promotions = [json.loads(line) for line in (run_dir / "promotions.jsonl").read_text().splitlines()]
    assert len(promotions) == 1 and promotions[0]["step"] == 2
    assert (run_dir / promotions[0]["path"] / "config.json").exists()
    pq = [json.loads(line) for line in (run_dir / "pq.jsonl").read_text().splitlines()]
    assert len(pq) == 8 and {r["promotion"] for r in pq} == {1} and all("+" in r["question"] for r in pq)
    dump = json.loads((run_dir / "steps" / "step_000002.json").read_text())
    assert len(dump["datasets"]) == 2 and dump["decision"]["promote"]
    # The promoted dataset's questions are exactly PQ, and its reward is the best of the step.
    best = dump["datasets"][dump["decision"]["dataset"]]
    assert [q["question"] for q in best["questions"]] == [r["question"] for r in pq]
    assert best["reward"] == max(d["reward"] for d in dump["datasets"])
    assert sum(d["advantage"] for d in dump["datasets"]) == pytest.approx(0, abs=1e-9)
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "hard_set" / "hard_train.jsonl").exists()
    print(f"arith_micro wall time: {seconds:.1f}s")


def alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def run_killed(args, env_extra=None, kill_after=None):
    """Start in its own process group; SIGKILL the group after ``kill_after`` s (or let it kill itself)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env_extra or {})}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate(timeout=300)[0].decode()
    deadline = time.time() + 10
    while alive(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not alive(proc.pid), "processes of the killed run survived 10 s"
    return proc.returncode, out


def test_sigkill_at_fixed_phases_and_a_random_moment_then_resume_equals_uninterrupted(reference_run, tiny_model_dir,
                                                                                       tmp_path):
    ref_dir = reference_run[0]
    run_dir = tmp_path / "killed"
    args = micro_args(tiny_model_dir, run_dir)
    for fault in ("teacher_sample:0", "student:1", "checkpoint:1", "teacher_sample:2"):
        rc, out = run_killed(args, {"SOAR_FAULT": fault})
        assert rc == -signal.SIGKILL, f"{fault}: expected the injected SIGKILL, got rc={rc}\n{out[-2000:]}"
    delay = float(np.random.default_rng(0).uniform(2, 10))  # somewhere in startup or step 3
    run_killed(args, kill_after=delay)
    rc, out = run_killed(args)
    assert rc == 0, out[-3000:]
    assert (run_dir / "pq.jsonl").read_bytes() == (ref_dir / "pq.jsonl").read_bytes()
    assert (run_dir / "promotions.jsonl").read_bytes() == (ref_dir / "promotions.jsonl").read_bytes()
    assert comparable_metrics(run_dir) == comparable_metrics(ref_dir)
