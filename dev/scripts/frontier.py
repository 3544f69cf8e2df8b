"""Measure the embedded world's learnability frontier (the criteria of the world's design) and write
``frontier.json``. A long run (tens of minutes on 2 cores), not CI.

    python dev/scripts/frontier.py --out runs/frontier
    python dev/scripts/frontier.py --out runs/frontier_b --overrides world.pretrain_carry_weights=[0.6,0.25,0.15]

Measures: base greedy accuracy by carry count; fail@k counts on the hard pool; inner-loop gains on
hard train/test for the stepping-stone (S), control (C) and Hard-Only (H) families (mean ± s.e.
over students); the untrained teacher's validity, answer correctness and S-fraction; the
correlation between a teacher dataset's S-fraction and its grounded reward (bootstrap CI); and τ,
the 95th percentile of the 3-step moving average of the mean reward with a never-updated teacher.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # soar.stats, installed or not

from soar.stats import icc, mean_se  # noqa: E402

WORLD_RECIPE = ["student.questions_per_step=32", "student.group_size=8", "student.lr=1e-4", "student.max_tokens=24",
                "student.max_steps=20", "student.micro_batch_size=256", "teacher.prompt=${world.teacher_prompt}",
                "teacher.questions_per_dataset=32", "teacher.lr=1e-4", "teacher.warmup_steps=3", "teacher.max_tokens=96",
                "teacher.micro_batch_size=128"]
"""The world's own student and teacher recipe, which these measurements use (the conf/student/arith.yaml
and conf/teacher/arith.yaml of before issue 51; experiment=arith tunes it further)."""

_WORKER: dict = {}


def _init_worker(model_dir: str, overrides: list[str]) -> None:
    import torch

    import soar
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer

    torch.set_num_threads(1)
    cfg = soar.compose(overrides)
    mcfg = type("M", (), {"path": model_dir, "revision": None, "dtype": "float32", "trust_remote_code": False})
    _WORKER.update(cfg=cfg, model=load_model(mcfg), tok=load_tokenizer(mcfg), grader=make_grader(cfg.data.grader))


def _student(task):
    """(label, seed, problems, eval_sets, eval_samples) -> (label, seed, accuracy, correct vectors, seconds)."""
    from soar.policy.scores import gold_logprobs
    from soar.students.trainer import train_student

    label, seed, problems, eval_sets, eval_samples = task
    w, t0 = _WORKER, time.perf_counter()
    cfg = w["cfg"]
    res = train_student(w["model"], w["tok"], w["grader"], problems, cfg.student, cfg.data.prompt_template,
                        seed, eval_sets, eval_samples)
    gold = {name: gold_logprobs(res.trainer.model, w["tok"], probs, cfg.data.prompt_template, cfg.inner.gold_completion)
            for name, probs in eval_sets.items()}
    return label, seed, res.accuracy, res.correct, time.perf_counter() - t0, gold


def correlation(x, y) -> float:
    """Pearson r; NaN where either side is constant."""
    return float(np.corrcoef(x, y)[0, 1]) if np.std(x) > 0 and np.std(y) > 0 else float("nan")


def teacher_samples(model, tok, wcfg, count: int, seed: int, max_tokens: int) -> list[dict]:
    from soar.generation import HFGenerator, SamplingParams
    from soar.teachers.parse import Pair, parse_pair
    from soar.worlds.arith import carries_of, oracle_answer, parse_question, route_text

    outs = HFGenerator(model, tok, batch_size=512).generate(
        [wcfg.teacher_prompt], SamplingParams(n=count, temperature=1.0, max_tokens=max_tokens, seed=seed))[0]
    rows, d = [], wcfg.digits
    for s in outs:
        parsed = parse_pair(s.text, answer_ok=lambda a: re.fullmatch(r"-?\d+", a) is not None)
        row = {"text": s.text, "valid": isinstance(parsed, Pair),
               "reason": None if isinstance(parsed, Pair) else parsed.reason}
        if isinstance(parsed, Pair):
            row.update(question=parsed.question, answer=parsed.answer)
            q = parse_question(parsed.question)
            if q is not None and q[2] == d:
                row.update(well_formed=True, carries=carries_of(*q),
                           answer_correct=parsed.answer == oracle_answer(parsed.question))
                if wcfg.teacher_carries != "none":  # is what it wrote outside the tags that of its question?
                    row["carries_right"] = route_text(*q, wcfg.teacher_carries) + "<" in s.text
            else:
                row.update(well_formed=False, carries=None, answer_correct=False)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/frontier")
    ap.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides (world.*, student.*, seed)")
    ap.add_argument("--students", type=int, default=4, help="students per family (S, C, Hard-Only)")
    ap.add_argument("--datasets", type=int, default=50, help="untrained-teacher datasets for the reward signal")
    ap.add_argument("--n", type=int, default=32, help="questions per teacher dataset")
    ap.add_argument("--qr", type=int, default=64, help="reward questions M drawn from hard train")
    ap.add_argument("--accuracy-samples", type=int, default=0,
                    help="reward Acc on Q_R: 0 greedy (paper), >0 mean over this many T=1 samples (inner.accuracy_samples)")
    ap.add_argument("--replicates", type=int, default=1,
                    help="students per teacher dataset: >1 measures how much of the reward is the dataset (ICC)")
    ap.add_argument("--g", type=int, default=4, help="datasets per outer step (for tau)")
    ap.add_argument("--k", type=int, default=128, help="fail@k samples")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-signal", action="store_true", help="only the S / C / Hard-Only gains (no teacher datasets)")
    ap.add_argument("--families", default="S,C,H", help="comma list of S, C, H to train ('' for none)")
    args = ap.parse_args()

    import soar
    from soar.data import load_problems
    from soar.filters.failk import run_filter
    from soar.generation import HFGenerator, correctness
    from soar.grading import make_grader
    from soar.models import load_model, load_tokenizer, set_threads
    from soar.worlds.arith import family_problems, write_families
    from soar.worlds.arith_pretrain import pretrain
    from soar.worlds.base import get_world

    overrides = ["data=arith", "data.path=unused", *WORLD_RECIPE, *args.overrides]
    cfg = soar.compose(overrides + [f"filter.k={args.k}", "filter.max_tokens=24", "filter.problems_per_batch=4"])
    wcfg = get_world("arith").config(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"overrides": overrides, "args": vars(args)}
    t0 = time.perf_counter()
    set_threads(0)
    model_dir = pretrain(wcfg, wcfg.seed)
    info = json.loads((model_dir / "train_info.json").read_text())
    report["pretrain"] = {k: info[k] for k in ("steps", "stopped_at_frontier", "seconds", "parameters")}
    mcfg = type("M", (), {"path": str(model_dir), "revision": None, "dtype": "float32", "trust_remote_code": False})
    model, tok = load_model(mcfg), load_tokenizer(mcfg)
    grader = make_grader("integer")
    gen = HFGenerator(model, tok, batch_size=512)

    def greedy(problems):
        return correctness(gen, grader, problems, cfg.data.prompt_template, max_tokens=24)

    # 1. base accuracy by difficulty
    profile = {}
    for c in range(wcfg.digits + 1):
        profile[c] = float(np.mean(greedy(family_problems(wcfg, [c], 128, cfg.seed + 99, "profile"))))
    report["base_greedy_by_carries"] = profile
    print("base greedy accuracy by carries:", profile, flush=True)

    # 2. fail@k on the hard pool
    paths = write_families(wcfg, wcfg.seed, out / "problems")
    pool = load_problems(cfg.data, str(paths["pool"]))
    summary = run_filter(pool, gen, grader, cfg, out, {"model": str(model_dir)})
    report["fail_at_k"] = {k: summary[k] for k in ("problems", "bands", "hard", "hard_train", "hard_test",
                                                   "throughput_this_session")}
    print("fail@k:", report["fail_at_k"], flush=True)
    hard_train = load_problems(cfg.data, str(out / "hard_train.jsonl"))
    hard_test = load_problems(cfg.data, str(out / "hard_test.jsonl"))
    stepping = load_problems(cfg.data, str(paths["stepping"]))
    control = load_problems(cfg.data, str(paths["control"]))
    hard_ids = {p.id for p in hard_train + hard_test}
    hard_q = {p.question for p in hard_train + hard_test}
    report["disjoint"] = not ({p.id for p in stepping + control} & hard_ids) and \
        not ({p.question for p in stepping + control} & hard_q)
    base_train, base_test = greedy(hard_train), greedy(hard_test)
    report["base_hard_acc"] = {"train": float(np.mean(base_train)), "test": float(np.mean(base_test))}

    # 3. teacher behaviour of the base model
    # Enough teacher samples for --datasets x --n valid pairs even at a 50 % valid rate.
    samples = teacher_samples(model, tok, wcfg, max(1024, 2 * args.datasets * args.n), cfg.seed + 7,
                              max_tokens=cfg.teacher.max_tokens)
    valid = [s for s in samples if s["valid"]]
    wf = [s for s in valid if s.get("well_formed")]
    s_like = [s for s in wf if s["carries"] in wcfg.stepping_carries]
    reasons = {}
    for s in samples:
        if s["reason"]:
            reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    by_carries = {}
    for s in wf:
        by_carries.setdefault(s["carries"], []).append(s["answer_correct"])
    report["base_teacher_correct_by_carries"] = {str(c): float(np.mean(v)) for c, v in sorted(by_carries.items())}
    report["base_teacher"] = {
        "s_like_correct_frac_of_valid": sum(s["answer_correct"] for s in s_like) / max(len(valid), 1),
        "samples": len(samples), "valid_frac": len(valid) / len(samples),
        "well_formed_frac_of_valid": len(wf) / max(len(valid), 1),
        "answer_correct_frac_of_valid": float(np.mean([s["answer_correct"] for s in valid])) if valid else 0.0,
        "s_like_frac_of_valid": len(s_like) / max(len(valid), 1),
        "carries_hist": {str(c): sum(1 for s in wf if s["carries"] == c) for c in range(wcfg.digits + 1)},
        "carries_right_frac_of_well_formed": (float(np.mean([s["carries_right"] for s in wf]))
                                              if wcfg.teacher_carries != "none" and wf else None),
        "reject_reasons": reasons}
    print("base teacher:", report["base_teacher"], flush=True)

    # 4. inner-loop gains (S, C, Hard-Only) and 5. reward signal from untrained-teacher datasets
    from soar.data import Problem

    eval_sets = {"hard_train": hard_train, "hard_test": hard_test}
    families = [f for f in args.families.split(",") if f]
    tasks = [(fam, 1000 + j, probs, eval_sets, 0) for fam, probs in (("S", stepping), ("C", control), ("H", hard_train))
             if fam in families for j in range(args.students)]
    pairs = valid[: args.datasets * args.n]
    n_sets = 0 if args.skip_signal else len(pairs) // args.n
    datasets = []
    for i in range(n_sets):
        chunk = pairs[i * args.n:(i + 1) * args.n]
        probs = [Problem(f"t{i}/{j}", s["question"], s["answer"], "teacher") for j, s in enumerate(chunk)]
        s_frac = float(np.mean([s.get("carries") in wcfg.stepping_carries for s in chunk]))
        s_correct = [s.get("carries") in wcfg.stepping_carries and s["answer_correct"] for s in chunk]
        datasets.append({"s_frac": s_frac, "s_correct_frac": float(np.mean(s_correct)),
                         "answer_correct_frac": float(np.mean([s["answer_correct"] for s in chunk]))})
        datasets[-1].update(carries_mean=float(np.mean([s["carries"] for s in chunk if s.get("carries") is not None]
                                                       or [0])),
                            correct_carries_mean=float(np.mean([s["carries"] for s in chunk if s["answer_correct"]] or [0])))
        tasks += [(f"D{i}", 2000 + 100 * j + i, probs, {"hard_train": hard_train}, args.accuracy_samples)
                  for j in range(args.replicates)]
    ctx = mp.get_context("spawn")
    results = []
    with ctx.Pool(args.workers, initializer=_init_worker, initargs=(str(model_dir), overrides)) as pool_:
        for r in pool_.imap_unordered(_student, tasks):
            results.append(r)
            print(f"  student {r[0]} seed {r[1]}: {r[2]} ({r[4]:.1f}s)", flush=True)
    report["student_seconds_mean"] = float(np.mean([r[4] for r in results]))
    report["inner_loop_gains"] = {fam: {split: mean_se([r[2][split] - report["base_hard_acc"][split.split("_")[1]]
                                                        for r in results if r[0] == fam])
                                        for split in ("hard_train", "hard_test")} for fam in families}
    (out / "frontier.json").write_text(json.dumps(report, indent=2, default=str))  # partial results survive a kill
    print("inner-loop gains:", {f: {s: (v["mean"], v["se"]) for s, v in d.items()}
                                for f, d in report["inner_loop_gains"].items()}, flush=True)

    rng = np.random.default_rng(cfg.seed + 11)
    base_reward = base_train if not args.accuracy_samples else correctness(
        gen, grader, hard_train, cfg.data.prompt_template, max_tokens=24, samples=args.accuracy_samples, seed=cfg.seed + 13)
    from soar.policy.scores import gold_logprobs

    base_gold = np.asarray(gold_logprobs(model, tok, hard_train, cfg.data.prompt_template, cfg.inner.gold_completion))
    report["base_gold_prob_hard_train"] = float(np.exp(base_gold).mean())
    rewards, rewards_all = [], []
    metrics = {"acc": lambda c, g: c, "gold_prob": lambda c, g: np.exp(g), "gold_logprob": lambda c, g: g}
    base_scores = {"acc": np.asarray(base_reward, dtype=float), "gold_prob": np.exp(base_gold), "gold_logprob": base_gold}
    for i, d in enumerate(datasets):
        reps = [r for r in results if r[0] == f"D{i}"]
        qr = rng.choice(len(hard_train), size=min(args.qr, len(hard_train)), replace=False)
        for name, fn in metrics.items():  # per replicate student, on Q_R and on all of hard train
            scores = [fn(np.asarray(r[3]["hard_train"], dtype=float), np.asarray(r[5]["hard_train"])) for r in reps]
            d[f"reward_{name}_replicates"] = [float(x[qr].mean() - base_scores[name][qr].mean()) for x in scores]
            d[f"reward_{name}_all_replicates"] = [float(x.mean() - base_scores[name].mean()) for x in scores]
        d["reward"] = float(np.mean(d["reward_acc_replicates"]))
        d["reward_all_hard_train"] = float(np.mean(d["reward_acc_all_replicates"]))  # M = all of hard train
        rewards.append(d["reward"])
        rewards_all.append(d["reward_all_hard_train"])
    if len(datasets) >= 3:
        sf = np.array([d["s_frac"] for d in datasets])
        rw = np.array(rewards)
        corr = correlation(sf, rw)
        boots = []
        for _ in range(2000):
            idx = rng.integers(0, len(sf), len(sf))
            if sf[idx].std() > 0 and rw[idx].std() > 0:
                boots.append(np.corrcoef(sf[idx], rw[idx])[0, 1])
        ci = [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))] if boots else None
        # tau: steps of g datasets from a never-updated teacher; 3-step moving average of the mean reward
        mas = []
        for _ in range(5000):
            steps = [rng.choice(rw, size=args.g, replace=False).mean() for _ in range(3)]
            mas.append(np.mean(steps))
        sc = np.array([d["s_correct_frac"] for d in datasets])
        corr_sc = correlation(sc, rw)
        features = ("s_frac", "s_correct_frac", "answer_correct_frac", "carries_mean", "correct_carries_mean")
        by_metric = {}
        for name in metrics:
            for scope in ("", "_all"):
                reps_DR = np.array([d[f"reward_{name}{scope}_replicates"] for d in datasets])
                y = reps_DR.mean(1)
                by_metric[name + scope] = {"mean": float(y.mean()), "sd": float(y.std(ddof=1)),
                                           "correlation": {f: correlation([d[f] for d in datasets], y) for f in features},
                                           "replicate_icc": icc(reps_DR)}
        report["reward_signal_by_metric"] = by_metric
        print("reward signal by metric:", json.dumps(by_metric, indent=1), flush=True)
        report["reward_signal"] = {"datasets": len(datasets), "accuracy_samples": args.accuracy_samples,
                                   "correlation_sfrac_reward": corr, "bootstrap_ci95": ci,
                                   "correlation_s_correct_frac_reward": corr_sc,
                                   "correlation_sfrac_reward_all_hard_train": correlation(sf, rewards_all),
                                   "reward_mean": float(rw.mean()), "reward_sd": float(rw.std(ddof=1)),
                                   "tau_p95_ma3": float(np.percentile(mas, 95)), "per_dataset": datasets}
        print("reward signal:", {k: v for k, v in report["reward_signal"].items() if k != "per_dataset"}, flush=True)
    report["seconds"] = time.perf_counter() - t0
    (out / "frontier.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out / 'frontier.json'} in {report['seconds']:.0f}s")


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    main()
