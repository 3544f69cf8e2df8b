"""The Ray student pool (``soar.students.pool``) on the micro world: students spread over worker
processes, results independent of the worker count and equal to in-process training, a killed
worker replaced with the student rerun from its seed, a second failure naming the student."""

import os

import pytest
import torch

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    import ray

    # never a running cluster; 4 logical CPUs: a second pool may start while the module's 2-worker one lives
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def world(tiny_model_dir):
    """Config, tokenizer, baseline, two datasets (1-2 carries) and Q_R (3 carries) of the micro world."""
    import soar
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.worlds.arith import generate_problems

    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", "resources.threads_per_worker=1",
                        "resources.batched=false"])  # the pool's students are the in-process ones, one by one
    datasets = [generate_problems(3, c, 8, seed=10 + c, prefix=f"d{c}") for c in (1, 2)]
    qr = generate_problems(3, 3, 8, seed=3, prefix="qr")
    return cfg, load_tokenizer(cfg.model), load_model(cfg.model), make_grader("integer"), datasets, qr


def rewards_for(world, workers: int, env: dict | None = None, step: int = 0):
    """One group's ``grounded`` reward on ``workers`` pool workers (0: in-process, 1 torch thread): its
    state (``RewardState``, whose ``students`` is the executor) and the group's rewards."""
    from omegaconf import OmegaConf

    from soar.rewards import GroupRecord, grounded, make_reward_state

    cfg, tok, base, grader, datasets, qr = world
    cfg = OmegaConf.merge(cfg, {"resources": {"num_workers": workers}})
    old_env = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    reward = make_reward_state(cfg, tok, grader, cfg.data.prompt_template)
    try:
        return reward, grounded(GroupRecord(datasets, base, qr, 0.25, step, 0, cfg.student.max_steps), reward)
    except BaseException:
        reward.close()
        raise
    finally:
        torch.set_num_threads(threads)
        for k, v in old_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def signature(res):
    """Everything a student's result holds except timings and placement."""
    return (res.rewards_KR.tolist(),
            [[(s.correct, [{k: v for k, v in h.items() if not k.startswith("time/")} for h in s.history])
              for s in row] for row in res.students_KR])


@pytest.fixture(scope="module")
def in_process(world):
    return rewards_for(world, 0)[1]


@pytest.fixture(scope="module")
def two_workers(world, ray_local):
    reward, res = rewards_for(world, 2)
    yield reward, res
    reward.close()


def test_two_workers_spread_students_over_two_processes_and_match_in_process(two_workers, in_process):
    _, res = two_workers
    where = [s.worker for row in res.students_KR for s in row]
    assert len(where) == 4  # g=2 datasets x r=2 replicates
    assert len({w["pid"] for w in where}) == 2 and os.getpid() not in {w["pid"] for w in where}
    assert all(w["node_id"] and w["attempts"] == 1 for w in where)
    assert signature(res) == signature(in_process)  # bit-identical: same weights, seeds, 1 thread


def test_one_worker_gives_the_same_results_as_two(world, ray_local, two_workers):
    reward, res = rewards_for(world, 1)
    try:
        assert len({s.worker["pid"] for row in res.students_KR for s in row}) == 1
        assert signature(res) == signature(two_workers[1])
    finally:
        reward.close()


def test_only_the_fetched_student_travels_and_matches_in_process(two_workers, in_process, tmp_path):
    from soar.generation import SamplingParams

    reward, res = two_workers
    # in process, only promotion candidates keep their policy (soar.students.pool.drop_unpromotable)
    k, j = next((k, j) for k, row in enumerate(in_process.students_KR) for j, s in enumerate(row) if s.trainer)
    remote, local = res.students_KR[k][j].trainer, in_process.students_KR[k][j].trainer
    prompts = ["<question>123+456</question><answer>", "<question>999+1</question><answer>"]
    params = SamplingParams(greedy=True, max_tokens=16)
    assert [o[0].text for o in remote.sampler().generate(prompts, params)] == \
           [o[0].text for o in local.sampler().generate(prompts, params)]  # generated inside the worker
    assert remote._policy is None  # nothing fetched for sampling
    fetched, expected = remote.export_model().state_dict(), local.export_model().state_dict()
    assert fetched.keys() == expected.keys() and all(torch.equal(fetched[k], expected[k]) for k in expected)
    remote.save_pretrained(tmp_path / "promoted")
    assert (tmp_path / "promoted" / "config.json").exists()


@pytest.mark.slow
def test_killed_worker_is_replaced_and_the_student_rerun_identically(world, ray_local, in_process, tmp_path):
    env = {"SOAR_FAULT": "pool_student:0:0:1:0", "SOAR_FAULT_ONCE": str(tmp_path / "fired")}
    reward, res = rewards_for(world, 2, env)
    try:
        assert (tmp_path / "fired").exists()  # the worker did kill itself mid-student
        victim = res.students_KR[1][0].worker
        assert victim["attempts"] == 2
        assert signature(res) == signature(in_process)
        assert len(set(reward.students.worker_pids())) == 2  # the pool is whole again
        # A kept student lost with a worker is retrained from its seed when needed. Kept: a promotion
        # candidate of the step (soar.students.pool.drop_unpromotable keeps at least one), whichever
        # students the model's rewards make them.
        k, j = next((k, j) for k, row in enumerate(in_process.students_KR) for j, s in enumerate(row) if s.trainer)
        pool = reward.students
        slot = res.students_KR[k][j].worker["worker"]
        pool.replace(slot)
        fetched = res.students_KR[k][j].trainer.export_model().state_dict()
        expected = in_process.students_KR[k][j].trainer.export_model().state_dict()
        assert all(torch.equal(fetched[k], expected[k]) for k in expected)
    finally:
        reward.close()


@pytest.mark.slow
def test_a_student_failing_twice_fails_the_run_naming_it(world, ray_local):
    from soar.students.pool import PoolError

    with pytest.raises(PoolError, match=r"student \(step 0, group 0, k 1, j 0\) failed twice"):
        rewards_for(world, 2, {"SOAR_FAULT": "pool_student:0:0:1:0"})


@pytest.mark.parametrize("overrides, message", [
    (["resources.num_workers=3"], r"resources.num_workers: 3 workers x 1 threads \+ 0 engine threads = 3 > 2 cores"),
    (["resources.num_workers=1", "resources.threads_per_worker=0"], "resources.threads_per_worker"),
    (["resources.num_workers=1", "resources.engine_threads=2"], "resources.num_workers"),
])
def test_pool_size_is_capped_by_cores_naming_the_field(overrides, message, tiny_model_dir, monkeypatch):
    import soar

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(soar.ConfigError, match=message):
        soar.validate(soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", *overrides]), "train")


def test_pool_size_is_capped_by_ram(tiny_model_dir, monkeypatch):
    import soar
    from soar import machine

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(machine, "available_ram_gb", lambda: 4.0)
    with pytest.raises(soar.ConfigError, match=r"resources.num_workers: 8 workers .* > 4.0 GB available; at most 3"):
        soar.validate(soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}",
                                    "resources.num_workers=8"]), "train")
    soar.validate(soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}",
                                "resources.num_workers=3"]), "train")


@pytest.mark.slow
def test_soar_train_on_the_pool_equals_in_process(tiny_model_dir, tmp_path):
    """The whole loop (a promotion at step 1, so step 2's students train on the promoted baseline the
    pool received) gives the same metrics, PQ and promotions with 2 workers as in-process."""
    import json

    from conftest import run_cli, script

    def train(run_dir, *extra):
        run_cli([script("soar-train"), "experiment=arith_micro", f"model.path={tiny_model_dir}", f"run.dir={run_dir}",
                 "run.threads=1", "run.progress=false", "loop.steps=2", "promotion.window=1", "resources.batched=false",
                 *extra], timeout=200)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    ref = train(tmp_path / "in_process")
    hard_set = tmp_path / "in_process" / "hard_set"
    pooled = train(tmp_path / "pool", f"loop.hard_set={hard_set}", "resources.num_workers=2")
    assert [r["promotion/promoted"] for r in ref] == [1, 1] and pooled == ref
    for name in ("pq.jsonl", "promotions.jsonl"):
        assert (tmp_path / "pool" / name).read_bytes() == (tmp_path / "in_process" / name).read_bytes()
    for step in (1, 2):
        dump = json.loads((tmp_path / "pool" / "steps" / f"step_{step:06d}.json").read_text())
        students = [s for d in dump["datasets"] for s in d["students"]]
        assert len(students) == 4 and len({s["pid"] for s in students}) == 2 and all(s["node_id"] for s in students)
        # generated in the worker during the teacher update (issue 49), the same completions
        alone = json.loads((tmp_path / "in_process" / "steps" / f"step_{step:06d}.json").read_text())
        assert dump["student_completions"] == alone["student_completions"] and len(alone["student_completions"]) == 2


def sized(tiny_model_dir, monkeypatch, *overrides):
    """arith_micro (g = 2 datasets x r = 2: 4 students a step) on a 64-core machine with ample RAM."""
    import soar
    from soar import machine

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(machine, "available_ram_gb", lambda: 256.0)
    return soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", *overrides])


def test_workers_beyond_the_students_of_a_step_are_refused(tiny_model_dir, monkeypatch):
    """Issue 49: 31 workers for the paper's 16 students left 15 GPUs idle the whole run. A worker
    beyond the step's students never trains one: refused, naming the count that fits."""
    import soar

    cfg = sized(tiny_model_dir, monkeypatch, "resources.num_workers=5")
    with pytest.raises(soar.ConfigError, match=r"resources.num_workers: 5 workers for 4 students per step \(teacher"
                                               r".groups_per_step 1 x teacher.datasets 2 x inner.replicates 2\): 1 "
                                               r"would never train one; set resources.num_workers=4"):
        soar.validate(cfg, "train")
    soar.validate(sized(tiny_model_dir, monkeypatch, "resources.num_workers=8", "teacher.groups_per_step=2"), "train")
    intrinsic = sized(tiny_model_dir, monkeypatch, "resources.num_workers=2", "teacher.reward=intrinsic",
                      "promotion.enabled=false")
    with pytest.raises(soar.ConfigError, match="teacher.reward=intrinsic trains no students"):
        soar.validate(intrinsic, "train")


def test_one_worker_per_student_is_derived_from_the_step(tiny_model_dir, monkeypatch):
    import soar

    for extra, workers in (([], 4), (["teacher.groups_per_step=2"], 8), (["inner.replicates=3"], 6)):
        cfg = sized(tiny_model_dir, monkeypatch, "resources.num_workers=${student_tasks:}", *extra)
        assert cfg.resources.num_workers == workers
        soar.validate(cfg, "train")


def test_a_part_idle_last_round_is_warned_naming_the_count_with_the_same_rounds(tiny_model_dir, monkeypatch, caplog):
    import soar

    soar.validate(sized(tiny_model_dir, monkeypatch, "resources.num_workers=2"), "train")
    assert "resources.num_workers" not in caplog.text  # 4 students in 2 full rounds
    soar.validate(sized(tiny_model_dir, monkeypatch, "resources.num_workers=3"), "train")
    assert ("3 workers train 4 students per step" in caplog.text and "2 rounds, the last with 1 of them busy (67 %"
            in caplog.text and "2 workers take the same 2 rounds" in caplog.text)


def test_a_pool_that_cannot_hold_its_gpu_shares_is_refused_before_waiting_on_ray(world, ray_local):
    """The workers' GPU shares are checked against Ray's GPUs before any worker starts (Ray would
    leave the rest pending for STARTUP_TIMEOUT_S); the message names the count and the share that fit."""
    import time

    from omegaconf import OmegaConf

    from soar.students.pool import PoolError, StudentPool, gpu_shortfall

    cfg, tok, _, grader, _, _ = world
    t0 = time.perf_counter()
    with pytest.raises(PoolError, match="Ray has none: set resources.gpus_per_student=0"):
        StudentPool(OmegaConf.merge(cfg, {"resources": {"num_workers": 2, "gpus_per_student": 0.5}}), tok, grader)
    assert time.perf_counter() - t0 < 30
    assert gpu_shortfall(16, 0.5, 8) is None and gpu_shortfall(32, 1, 32) is None
    assert gpu_shortfall(16, 1, 7).endswith("use at most 7 workers, or resources.gpus_per_student=0.3333 to put 3 "
                                            "on each GPU")
    assert "use at most 8 workers, or resources.gpus_per_student=0.5 to put 2" in gpu_shortfall(16, 1, 8)
