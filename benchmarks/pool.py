"""The Ray student pool vs the same students one after another in one process, at equal total
threads (issue 7, benchmark 4), plus memory per worker (per-student state: ``benchmarks/memory.py``).
Writes JSON.

    python benchmarks/pool.py --out benchmarks/results/pool.json    # arith_micro world, ~2 min on 2 cores

Sequential: ``resources.num_workers=0`` in this process with ``--threads`` torch threads. Pool:
``--workers`` workers x ``--threads // --workers`` threads. Both train the same tasks (g datasets x r
replicates per step, ``--steps`` steps), timed alternately ``--repeats`` times after a warm-up; the
pool's start-up (Ray + worker imports) is reported apart. The pool's results must equal the
sequential ones at the same threads per student (float sums depend on the thread count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def rss_gb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**30


def ray_system_rss_gb() -> float:
    """Resident memory of this Ray instance's own processes (GCS, raylet, agents), not the workers."""
    import psutil
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path()).name
    total = 0
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        if any(session in part for part in proc.info["cmdline"] or []):
            total += proc.info["memory_info"].rss
    return total / 2**30


def signature(results) -> list:
    return [(s.correct, [{k: v for k, v in h.items() if not k.startswith("time/")} for h in s.history])
            for s in results]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default="arith_micro")
    ap.add_argument("--datasets", type=int, default=4, help="students per step = datasets x replicates")
    ap.add_argument("--replicates", type=int, default=2)
    ap.add_argument("--inner-steps", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="outer steps (each a fresh set of student seeds)")
    ap.add_argument("--threads", type=int, default=2, help="total threads of both arms")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/pool.json")
    ap.add_argument("--omp-wait", default="PASSIVE", help="OMP_WAIT_POLICY of the sequential arm (workers: PASSIVE)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait  # before torch starts OpenMP

    import torch
    from omegaconf import OmegaConf

    import soar
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer
    from soar.run import package_versions
    from soar.students.pool import InProcessStudents, StudentPool, StudentRunner, StudentTask
    from soar.worlds.arith import generate_problems
    from soar.worlds.arith_pretrain import pretrain
    from soar.worlds.base import configured_world

    cfg = soar.compose([f"experiment={args.experiment}"])
    wcfg = configured_world(cfg).config(cfg)
    cfg = OmegaConf.merge(cfg, {"model": {"path": str(pretrain(wcfg, wcfg.seed, progress=False))},
                                "resources": {"num_workers": args.workers,
                                              "threads_per_worker": max(args.threads // args.workers, 1)}})
    soar.validate(cfg, "train")
    tok, base = load_tokenizer(cfg.model), load_model(cfg.model)
    digits = wcfg.digits
    datasets = [generate_problems(digits, 1 + k % 2, cfg.teacher.questions_per_dataset, seed=100 + k, prefix=f"d{k}")
                for k in range(args.datasets)]
    qr = generate_problems(digits, digits, cfg.inner.reward_questions, seed=7, prefix="qr")
    steps = [[StudentTask(t, 0, k, j, tuple(d), args.inner_steps) for k, d in enumerate(datasets)
              for j in range(args.replicates)] for t in range(args.steps)]

    runner = StudentRunner(cfg, tok, make_grader(cfg.data.grader), cfg.data.prompt_template)
    sequential = InProcessStudents(runner)
    torch.set_num_threads(1)  # same thread count per student as the workers: bit-identical results
    t0 = time.perf_counter()
    one_thread_sig = [signature(sequential.run(tasks, base, qr)) for tasks in steps]
    one_thread_s = time.perf_counter() - t0
    torch.set_num_threads(args.threads)
    sequential.run(steps[0][:1], base, qr)  # warm-up
    driver_rss_before_ray = rss_gb(os.getpid())

    t0 = time.perf_counter()
    pool = StudentPool(cfg, tok, make_grader(cfg.data.grader))
    startup_s = time.perf_counter() - t0
    idle_worker_gb = [rss_gb(pid) for pid in pool.worker_pids()]
    pool.run(steps[0][:args.workers], base, qr)  # warm-up (and the one baseline transfer)
    seq_s, pool_s, pool_sig, pids = [], [], [], set()
    for rep in range(args.repeats):  # interleaved, so drifting load on a shared machine hits both arms
        for tasks in steps:
            t0 = time.perf_counter()
            sequential.run(tasks, base, qr)
            seq_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            res = pool.run(tasks, base, qr)
            pool_s.append(time.perf_counter() - t0)
            pool_sig.append(signature(res))
            pids |= {s.worker["pid"] for s in res}
            print(f"repeat {rep} step {tasks[0].step}: sequential {seq_s[-1]:.2f} s, pool {pool_s[-1]:.2f} s")
    busy_worker_gb = [rss_gb(pid) for pid in pool.worker_pids()]
    ray_gb = ray_system_rss_gb()
    pool.close()

    memory = {"worker_idle_rss_gb": idle_worker_gb, "worker_after_steps_rss_gb": busy_worker_gb,
              "ray_system_rss_gb": ray_gb, "driver_rss_gb_before_ray": driver_rss_before_ray}
    total_seq, total_pool = sum(seq_s), sum(pool_s)
    out = {"benchmark": "pool", "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                            "processor": platform.processor(), "loadavg_at_end": os.getloadavg()},
           "versions": package_versions(), "config": vars(args),
           "students_per_step": args.datasets * args.replicates,
           "results": {"sequential_s": seq_s, "pool_s": pool_s, "pool_startup_s": startup_s,
                       "sequential_one_thread_s_per_step": one_thread_s / len(steps),
                       "speed_ratio_pool_vs_sequential": total_seq / total_pool,
                       "pool_identical_to_one_thread_sequential": pool_sig == one_thread_sig * args.repeats,
                       "distinct_worker_pids": len(pids)},
           "memory": memory}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out["results"], indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
