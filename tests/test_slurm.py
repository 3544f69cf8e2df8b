"""soar on a real SLURM cluster (two slurmd "nodes" on this host, ``tests/slurm_cluster.py``), all on
``experiment=arith_micro`` with the hf backend:

- a Hydra ``-m seed=0,1`` sweep through the submitit launcher: one job per seed, one run dir each;
- ``slurm/soar.sbatch`` stopped mid-run with SIGUSR1: the stage checkpoints at a step boundary and
  exits 75, the job requeues itself and the requeued job resumes to the uninterrupted run's result;
- a two-node ``slurm/soar.sbatch`` job: a Ray cluster over both nodes, the loop's students on both
  node ids, Ray torn down afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, script

SBATCH = REPO / "slurm" / "soar.sbatch"


def micro(model_dir, *extra) -> list[str]:
    return ["experiment=arith_micro", f"model.path={model_dir}", "run.threads=1", "run.progress=false", *extra]


def comparable_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def wait_for(predicate, timeout: float, what, poll: float = 0.2):
    """Poll ``predicate`` until truthy; ``what`` (a string or a callable giving one) names it on timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what() if callable(what) else what}: not after {timeout} s")


def sbatch_env(cluster, **extra) -> dict:
    (cluster.root / "ray").mkdir(exist_ok=True)
    return {**cluster.env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "SOAR_OBJECT_STORE_MB": "128",
            "SOAR_RAY_TMP": str(cluster.root / "ray"), **extra}


def submit(cluster, out: Path, sbatch_args: list[str], overrides: list[str], **env) -> str:
    res = subprocess.run(["sbatch", "--parsable", f"--output={out}", "--cpus-per-task=1", "--time=10",
                          *sbatch_args, str(SBATCH), *overrides],
                         env=sbatch_env(cluster, **env), capture_output=True, text=True, timeout=30, check=True)
    return res.stdout.strip().split(";")[0]


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tiny_model_dir, tmp_path_factory):
    """``soar-train -m seed=0,1 hydra/launcher=submitit_slurm``, run from a fresh folder."""
    cwd = tmp_path_factory.mktemp("sweep")
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    res = subprocess.run([script("soar-train"), "-m", *micro(tiny_model_dir), "seed=0,1",
                          "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1",
                          "hydra.launcher.timeout_min=10"],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    seconds = time.perf_counter() - t0
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}\n{slurm_cluster.logs()}"
    return cwd, seconds


@pytest.mark.timeout(300)
def test_hydra_seed_sweep_through_submitit_gives_one_job_and_one_run_dir_per_seed(sweep):
    cwd, seconds = sweep
    runs = cwd / "runs"
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) == ["arith_micro_s0", "arith_micro_s1"]
    submission = list((runs / ".sweeps").glob("*/.submitit/*/*_submission.sh"))
    assert len(submission) == 1 and "#SBATCH --requeue" in submission[0].read_text()
    tasks = sorted((runs / ".sweeps").glob("*/.submitit/*_*/*_result.pkl"))
    assert len(tasks) == 2, tasks  # one SLURM job (array task) per seed, each with a result
    for seed in (0, 1):
        run_dir = runs / f"arith_micro_s{seed}"
        rows = comparable_metrics(run_dir)
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
        assert f"seed: {seed}\n" in (run_dir / "config.yaml").read_text()
    assert comparable_metrics(runs / "arith_micro_s0") != comparable_metrics(runs / "arith_micro_s1")
    print(f"two-seed submitit sweep: {seconds:.1f} s")


@pytest.mark.timeout(300)
def test_usr1_stops_at_a_step_boundary_requeues_and_resumes_to_the_uninterrupted_result(slurm_cluster, sweep,
                                                                                        tiny_model_dir, tmp_path):
    reference = sweep[0] / "runs" / "arith_micro_s0"  # the same overrides, uninterrupted
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    job = submit(slurm_cluster, out, ["--nodes=1"], micro(tiny_model_dir, "seed=0", f"run.dir={run_dir}"))
    wait_for(lambda: (run_dir / "checkpoints" / "step_000001" / "DONE").exists(), 180,
             lambda: f"job {job}'s first checkpoint\n{out.read_text()[-3000:] if out.exists() else ''}\n"
                     f"{slurm_cluster.logs()}")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    # The first run stops (exit 75) and requeues; the second one must start, resume and finish.
    wait_for(lambda: "restart 1]" in out.read_text(), 120, lambda: f"job {job} restarting\n{out.read_text()[-3000:]}")
    state = slurm_cluster.wait_job(job, 180)
    log = out.read_text()
    assert state == "COMPLETED", f"{state}\n{log[-4000:]}\n{slurm_cluster.logs()}"
    assert re.search(r"soar: stopped by SIGUSR1 after outer step [12]; checkpointed, exit 75", log), log[-4000:]
    assert "stage exited with 75" in log and "requeueing" in log
    assert re.search(r"resumed from .*step_00000[12] after outer step [12]", log), log[-4000:]
    assert "Restarts=1" in slurm_cluster.run("scontrol", "show", "job", job).stdout
    assert (run_dir / "pq.jsonl").read_bytes() == (reference / "pq.jsonl").read_bytes()
    assert (run_dir / "promotions.jsonl").read_bytes() == (reference / "promotions.jsonl").read_bytes()
    assert comparable_metrics(run_dir) == comparable_metrics(reference)


@pytest.mark.timeout(300)
def test_submitit_job_signalled_usr2_is_requeued_by_submitit_and_resumes_in_the_same_run_dir(slurm_cluster, sweep,
                                                                                              tiny_model_dir, tmp_path):
    """What a preemption or the time limit does to a sweep job: submitit gets USR2, requeues the job
    and exits; the requeued job resumes from the last checkpoint of the same run dir."""
    reference = sweep[0] / "runs" / "arith_micro_s0"
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([script("soar-train"), "-m", *micro(tiny_model_dir), "seed=0", "hydra/launcher=submitit_slurm",
                             "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "runs" / "arith_micro_s0"
    try:
        wait_for(lambda: (run_dir / "checkpoints" / "step_000001" / "DONE").exists() or proc.poll() is not None, 180,
                 "first checkpoint")
        job = slurm_cluster.run("squeue", "-h", "-o", "%A").stdout.split()[0]
        slurm_cluster.run("scancel", "--signal=USR2", job)
        out = proc.communicate(timeout=240)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    log = "".join(p.read_text() for p in (tmp_path / "runs" / ".sweeps").glob("*/.submitit/*/*_log.*"))
    assert "Requeued job" in log and re.search(r"resumed from .*step_00000[12] after outer step [12]", log), log[-3000:]
    assert "Restarts=1" in slurm_cluster.run("scontrol", "show", "job", job).stdout
    assert (run_dir / "pq.jsonl").read_bytes() == (reference / "pq.jsonl").read_bytes()
    assert comparable_metrics(run_dir) == comparable_metrics(reference)


@pytest.mark.timeout(30)
def test_stop_request_catches_term_and_usr1_once_and_exits_75():
    """soar.signals without SLURM: the flag, repeats ignored, SystemExit(75), handlers restored."""
    import os
    import signal

    from soar.signals import EXIT_STOPPED, StopRequest

    before = signal.getsignal(signal.SIGUSR1)
    stop = StopRequest.install()
    assert not stop.requested
    stop.exit_if_requested(0)  # nothing requested: returns (and restores)
    stop = StopRequest.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGTERM)  # a repeat (another signal too) changes nothing
    assert stop.requested and stop.signum == signal.SIGUSR1
    with pytest.raises(SystemExit) as exc:
        stop.exit_if_requested(2, 3)
    assert exc.value.code == EXIT_STOPPED == 75
    assert signal.getsignal(signal.SIGUSR1) is before
    stop = StopRequest.install()
    os.kill(os.getpid(), signal.SIGTERM)
    stop.exit_if_requested(3, 3)  # the run is complete: nothing to resume, a normal exit


def ray_processes(job: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if f"ray-{job}-" in line]


@pytest.mark.timeout(300)
def test_two_node_job_runs_ray_across_both_nodes_with_students_on_both(slurm_cluster, tiny_model_dir, tmp_path):
    """Also: SOAR_DRIVER_GPUS keeps the head's first GPU (of a made-up CUDA_VISIBLE_DEVICES) for the stage."""
    run_dir, out = tmp_path / "run", tmp_path / "job.out"
    t_submit = time.time()
    job = submit(slurm_cluster, out, ["--nodes=2"], micro(tiny_model_dir, f"run.dir={run_dir}", "resources.num_workers=2"),
                 CUDA_VISIBLE_DEVICES="0,1", SOAR_DRIVER_GPUS="1")
    text = lambda: out.read_text() if out.exists() else ""  # noqa: E731
    t_start = wait_for(lambda: "] nodes " in text() and time.time(), 120, lambda: f"job {job} starting: {text()}")
    t_ray = wait_for(lambda: "ray up: " in text() and time.time(), 120, lambda: f"Ray of job {job}: {text()[-3000:]}")
    t_first = wait_for(lambda: (run_dir / "steps" / "step_000001.json").exists() and time.time(), 240,
                       lambda: f"first outer step of job {job}: {text()[-3000:]}")
    state = slurm_cluster.wait_job(job, 180)
    log = out.read_text()
    assert state == "COMPLETED", f"{state}\n{log[-4000:]}\n{slurm_cluster.logs()}"
    nodes = json.loads(re.search(r"^ray nodes: (.*)$", log, re.M).group(1))
    node_ids = {n["node_id"] for n in nodes}
    assert len(node_ids) == 2, nodes  # the head on node1, a worker on node2
    assert "GPUs on the head: stage 0, Ray 1" in log and 1 in [n["gpus"] for n in nodes], nodes
    used = set()
    for step in sorted((run_dir / "steps").glob("step_*.json")):
        for ds in json.loads(step.read_text())["datasets"]:
            used |= {s["node_id"] for s in ds["students"]}
    assert used == node_ids, (used, node_ids)  # 1 CPU per node and 2 one-CPU workers: one on each node
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 3
    assert "ray down" in log
    wait_for(lambda: not ray_processes(job), 30, lambda: f"ray processes of job {job} gone: {ray_processes(job)}")
    assert not list((slurm_cluster.root / "ray").glob(f"ray-{job}-*")), "per-job Ray temp dirs left behind"
    print(f"two-node job: sbatch to script start {t_start - t_submit:.1f} s, to Ray up on both nodes "
          f"{t_ray - t_submit:.1f} s, to first outer step done {t_first - t_submit:.1f} s; "
          f"SLURM daemons to idle nodes {slurm_cluster.bringup_s:.1f} s")
