"""``soar-eval``: fresh-student evaluation (paper §5), pass@k and slope-rule checkpoint selection.

    soar-eval experiment=arith eval.run_dir=runs/arith eval.method=hard_only run.name=eval_ho_s0
    soar-eval experiment=arith eval.run_dir=runs/arith eval.method=pq eval.mixing=curriculum run.name=eval_pq_s0
    soar-eval experiment=arith eval.run_dir=runs/arith eval.method=questions \
        eval.questions=runs/arith_base/export/teacher_step_000000 eval.label=Base-T run.name=eval_bt_s0
    soar-eval experiment=arith eval.run_dir=runs/arith eval.method=oracle run.name=eval_or_s0
    soar-eval experiment=arith eval.run_dir=runs/arith eval.method=ps run.name=eval_ps    # no training

Training methods (``hard_only``, ``pq``, ``questions``, ``oracle``) train a fresh copy of the base
model with the student RLOO recipe on synthetic questions and hard-train (``eval.mixing``), and
evaluate greedy accuracy and pass@k on hard-test every ``eval.eval_every`` steps; inference-only
methods (``ps``, ``teacher``, ``base``) evaluate one model over ``eval.inference_seeds`` seeds.
The run dir gets ``metrics.jsonl`` (``student/*`` per step, ``eval/*`` at evaluation steps),
``eval.json`` (the summary: slope rule, window mean, fixed step, final) and ``questions.jsonl``; the
runs of several seeds are aggregated by ``soar.eval_tables``.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import asdict, dataclass

import numpy as np
from omegaconf import OmegaConf

from soar.config import INFERENCE_METHODS, ConfigError
from soar.data import Problem, text_key, write_jsonl
from soar.export import load_questions, load_teacher
from soar.generation import correctness, make_generator
from soar.grading import make_grader
from soar.metrics_log import MetricsLogger
from soar.models import load_model
from soar.policy.trainer import RLOOTrainer
from soar.prepare import given_hard_set, has_hard_split, read_hard_split
from soar.rundata import RunDataError, check_eligible, read_run
from soar.seeding import derive_seed
from soar.stage import setup_stage
from soar.stats import sample_sd
from soar.students.trainer import batch_indices
from soar.validation import fail
from soar.worlds.base import configured_world

log = logging.getLogger("soar.evaluate")
TRAINING_METHODS = ("hard_only", "pq", "questions", "oracle")


# ---- pass@k -------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: 1 - C(n-c, k) / C(n, k), as the
    stable product 1 - prod_{i=n-c+1}^{n} (1 - k / i)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_means(correct_counts, n: int, ks) -> dict[str, float]:
    """``eval/pass@k`` averaged over problems."""
    return {f"eval/pass@{k}": float(np.mean([pass_at_k(n, int(c), k) for c in correct_counts])) for k in ks}


# ---- slope rule ---------------------------------------------------------------------------------
@dataclass
class SlopeRuleResult:
    stop_step: int
    """Selected step (1-based training step)."""
    fallback: bool
    """True when the rule found no step and ``stop_step`` is the fallback."""
    reason: str
    max_slope: float | None = None
    """Steepest positive slope of the smoothed curve, normalised by the reward range."""
    max_slope_step: int | None = None
    first_step: int = 1
    """First step of the curve the rule ran on (after a curriculum's synthetic-only steps)."""


def centred_moving_average(values, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, means) of a centred moving average over interior points only; ``values[i]`` is step i+1."""
    x = np.asarray(values, dtype=float)
    half = window // 2
    if len(x) < window:
        return np.array([], dtype=int), np.array([])
    means = np.convolve(x, np.ones(window) / window, mode="valid")
    return np.arange(half + 1, half + 1 + len(means)), means


def slope_rule(rewards, window: int = 25, threshold: float = 0.15, fallback_step: int | None = None,
               first_step: int = 1) -> SlopeRuleResult:
    """Paper App. B.6, well defined: centred ``window``-step MA of the training reward (interior
    points); slope at step s = (MA(s) - MA(s-1)) / (max - min of the rewards); from the steepest
    positive slope, the first later step whose slope is below ``threshold`` x that slope.
    Falls back to ``fallback_step`` (None: the last step) when there is no positive slope or the
    slope never drops below the threshold. Only steps from ``first_step`` on (1-based) make the
    curve (``rewards[first_step - 1:]``, its range included); steps keep the run's numbering."""
    last, skip = len(rewards), first_step - 1
    fallback = fallback_step if fallback_step is not None else last
    curve = np.asarray(rewards[skip:], dtype=float)
    steps, ma = centred_moving_average(curve, window)
    steps = steps + skip
    span = float(np.ptp(curve)) if len(curve) else 0.0
    if len(ma) < 2 or span == 0:
        return SlopeRuleResult(fallback, True, f"curve too short ({len(curve)} steps < {window + 1}) or flat",
                               first_step=first_step)
    slopes = np.diff(ma) / span
    slope_steps = steps[1:]
    top = int(np.argmax(slopes))
    max_slope = float(slopes[top])
    if max_slope <= 0:
        return SlopeRuleResult(fallback, True, "no positive slope", max_slope, int(slope_steps[top]), first_step)
    below = np.nonzero(slopes[top:] < threshold * max_slope)[0]
    if len(below) == 0:
        return SlopeRuleResult(fallback, True, f"slope never fell below {threshold:.0%} of its maximum",
                               max_slope, int(slope_steps[top]), first_step)
    stop = int(slope_steps[top + below[0]])
    return SlopeRuleResult(stop, False, f"first step after the steepest slope with slope < {threshold:.0%} of it",
                           max_slope, int(slope_steps[top]), first_step)


def slope_rule_first_step(ecfg, synthetic: list) -> int:
    """Where a fresh student's slope rule starts: after the synthetic-only steps of a curriculum (their
    reward is on other questions, and it drops at the switch to hard-train), else at step 1."""
    return ecfg.curriculum_steps + 1 if ecfg.mixing == "curriculum" and synthetic else 1


def window_mean(evals: list[dict], start: int, length: int, last_step: int) -> dict:
    """Mean of each ``eval/*`` metric over evaluations at steps in [start, start + length];
    ``truncated`` when the window runs past the last step. With no evaluation in the window, the
    first one after ``start`` (or the last one) is used and ``no_eval_in_window`` is set."""
    inside = [e for e in evals if start <= e["step"] <= start + length]
    flags = {"truncated": start + length > last_step, "no_eval_in_window": not inside}
    if not inside:
        after = [e for e in evals if e["step"] >= start]
        inside = [after[0] if after else evals[-1]]
    keys = [k for k in inside[0] if k.startswith("eval/")]
    return {"steps": [e["step"] for e in inside], **flags,
            **{k: float(np.mean([e[k] for e in inside])) for k in keys}}


def at_step(evals: list[dict], step: int) -> dict:
    """The evaluation at ``step``, or the nearest one (its step is recorded)."""
    return dict(min(evals, key=lambda e: (abs(e["step"] - step), e["step"])))


# ---- evaluating one solver ----------------------------------------------------------------------
def evaluate_solver(generator, grader, problems, template: str, student_cfg, ecfg, seed: int) -> dict:
    """Greedy accuracy and pass@k (``ecfg.samples`` samples at ``ecfg.temperature``) on ``problems``."""
    max_tokens, stop = student_cfg.eval_max_tokens or student_cfg.max_tokens, tuple(student_cfg.stop)
    frac = correctness(generator, grader, problems, template, max_tokens, stop, ecfg.samples,
                       derive_seed(seed, "pass_at_k"), ecfg.temperature)
    greedy = correctness(generator, grader, problems, template, max_tokens, stop, 0)
    counts = [round(f * ecfg.samples) for f in frac]
    return {"eval/greedy_acc": float(np.mean(greedy)), **pass_at_k_means(counts, ecfg.samples, ecfg.ks)}


def batch_for_step(step: int, synthetic: list, hard: list, ecfg, per_step: int, seed: int) -> list:
    """The questions of one fresh-student step under ``eval.mixing`` (no synthetic: hard-train)."""
    def draw(pool, n, s, stream):
        return [pool[i] for i in batch_indices(len(pool), s, n, derive_seed(seed, stream))] if n else []

    if not synthetic:
        return draw(hard, per_step, step, "hard")
    if ecfg.mixing == "curriculum":
        if step < ecfg.curriculum_steps:
            return draw(synthetic, per_step, step, "synthetic")
        return draw(hard, per_step, step - ecfg.curriculum_steps, "hard")
    if ecfg.synthetic_frac is None:
        return draw(synthetic + hard, per_step, step, "union")
    n_syn = int(round(ecfg.synthetic_frac * per_step))
    return draw(synthetic, n_syn, step, "synthetic") + draw(hard, per_step - n_syn, step, "hard")


def train_fresh_student(base, tokenizer, grader, synthetic, hard, test, cfg, metrics_log) -> dict:
    """RLOO from a fresh copy of ``base`` (the paper's fresh-student protocol), evaluating on
    ``test`` at step 0, every ``eval.eval_every`` steps and at the end."""
    ecfg = cfg.eval
    warmup = 0 if ecfg.mixing == "curriculum" and synthetic else ecfg.warmup_steps
    scfg = OmegaConf.merge(cfg.student, {"max_steps": ecfg.steps, "warmup_steps": warmup,
                                         "lr": cfg.student.lr if ecfg.lr is None else ecfg.lr})
    ref = copy.deepcopy(base) if scfg.lora.r == 0 and scfg.kl_coef > 0 else None
    trainer = RLOOTrainer(copy.deepcopy(base), tokenizer, grader, scfg, cfg.data.prompt_template,
                          derive_seed(cfg.seed, "fresh_student"), ref_model=ref, batch_size=cfg.backend.batch_size,
                          generator=make_generator(cfg, "student", None, tokenizer))
    eval_gen = make_generator(cfg, "eval", None, tokenizer)
    synthetic_ids = {p.id for p in synthetic}

    def evaluate(step):
        row = {"step": step, **evaluate_solver(trainer.sampler(eval_gen), grader, test, cfg.data.prompt_template, scfg, ecfg,
                                               derive_seed(cfg.seed, "eval", step))}
        evals.append(row)
        return row

    evals, rewards, accuracies, synthetic_drawn = [], [], [], 0
    metrics_log.log(0, {k: v for k, v in evaluate(0).items() if k != "step"})
    for step in range(ecfg.steps):
        batch = batch_for_step(step, synthetic, hard, ecfg, scfg.questions_per_step, cfg.seed)
        synthetic_drawn += sum(p.id in synthetic_ids for p in batch)
        grader.reset_stats()
        metrics = dict(trainer.step(batch).metrics)
        rewards.append(metrics["student/reward_mean"])
        accuracies.append(metrics["student/accuracy"])
        done = step + 1
        if done % ecfg.eval_every == 0 or done == ecfg.steps:
            metrics.update({k: v for k, v in evaluate(done).items() if k != "step"})
        metrics_log.log(done, metrics)
    return {"evals": evals, "train_reward": rewards, "train_accuracy": accuracies, "warmup_steps": warmup,
            "synthetic_frac_realised": synthetic_drawn / max(ecfg.steps * scfg.questions_per_step, 1)}


# ---- the stage ----------------------------------------------------------------------------------
def load_hard_split(cfg, run) -> tuple[list, list, str]:
    """(train, test, source): ``eval.hard_set`` or ``loop.hard_set`` read as ``soar-train`` reads a
    given hard set (one split per hard set, whatever the seed), else the split ``run`` trained on."""
    for field in ("eval.hard_set", "loop.hard_set"):
        if OmegaConf.select(cfg, field):
            return given_hard_set(cfg, field=field)
    if run is None:
        raise ConfigError("config error: eval.hard_set: give a hard set (or eval.run_dir / loop.hard_set)")
    if has_hard_split(run.path / "hard_set"):  # built by the run, or derived from its loop.hard_set
        return *read_hard_split(cfg, run.path / "hard_set"), str(run.path / "hard_set")
    if run.config.loop.hard_set:  # a hard-set folder, read as given
        return given_hard_set(OmegaConf.merge(cfg, {"loop": {"hard_set": run.config.loop.hard_set}}))
    raise RunDataError(f"{run.path / 'hard_set'}: missing hard_train.jsonl / hard_test.jsonl")


def without_hard_test(pool: list, hard_test: list) -> tuple[list, int]:
    """``pool`` less every problem whose id or question (as text, ``soar.data.text_key``) is in
    ``hard_test``, and how many that removed: training questions must not include the test set."""
    ids, questions = {p.id for p in hard_test}, {text_key(p.question) for p in hard_test}
    kept = [p for p in pool if p.id not in ids and text_key(p.question) not in questions]
    return kept, len(pool) - len(kept)


def synthetic_questions(cfg, run, hard_test: list) -> tuple[list, dict]:
    """The synthetic set of a training method, and notes for the summary. The oracle's pool is
    drawn from without the hard-test problems (``without_hard_test``)."""
    ecfg, method = cfg.eval, cfg.eval.method
    if method == "hard_only":
        return [], {}
    if method == "pq":
        eligible = check_eligible(run, cfg.pq, "evaluate")
        if not run.pq:
            return [], {"eligible": eligible, "pq_size": 0}
        return [Problem(r["id"], r["question"], r["answer"], "pq", {"promotion": r.get("promotion")}) for r in run.pq], \
            {"eligible": eligible, "pq_size": len(run.pq), "promotions": len(run.promotions)}
    if method == "questions":
        if not ecfg.questions:
            raise ConfigError("config error: eval.questions: method=questions needs a dataset path")
        return load_questions(ecfg.questions, cfg.data), {"questions": str(ecfg.questions)}
    if method == "oracle":
        rng = np.random.default_rng(cfg.seed)
        if ecfg.oracle_path:
            pool = load_questions(ecfg.oracle_path, cfg.data, "oracle")
        elif cfg.world is not None:
            pool = configured_world(cfg).oracle_problems(cfg, ecfg.oracle_size)
        else:
            raise ConfigError("config error: eval.oracle_path: method=oracle needs real training questions")
        source = ecfg.oracle_path or "world stepping-stone family"
        pool, excluded = without_hard_test(pool, hard_test)
        if not pool:
            raise ConfigError(f"config error: eval.oracle_path: every question of {source} is in hard-test")
        pick = rng.choice(len(pool), size=min(ecfg.oracle_size, len(pool)), replace=False)
        return [pool[i] for i in sorted(pick)], {"oracle_source": source, "oracle_pool": len(pool),
                                                 "oracle_excluded_hard_test": excluded}
    raise AssertionError(method)


def check_inference_model(cfg, run) -> None:
    """What an inference-only row loads exists (before the run dir is written): the promoted students
    (PS: an eligible run with at least one, each a model folder) or the teacher checkpoint."""
    if cfg.eval.method == "teacher":
        run.teacher_checkpoint(cfg.eval.teacher_step)
    elif cfg.eval.method == "ps":
        check_eligible(run, cfg.pq, "evaluate")
        if not run.promotions:
            raise RunDataError(f"{run.path}: 0 promotions: no promoted student to evaluate")
        for p in run.promotions:
            if not (run.path / p["path"] / "config.json").is_file():
                raise RunDataError(f"{run.path / p['path'] / 'config.json'}: missing (promoted student {p['promotion']})")


def inference_model(cfg, run, tokenizer, grader, hard_train):
    """(generator, description) of an inference-only row (checked by ``check_inference_model``): the best
    promoted student by greedy hard-train accuracy (PS), a teacher checkpoint, or the base model."""
    method, s = cfg.eval.method, cfg.student
    if method == "base":
        return make_generator(cfg, "eval", load_model(cfg.model), tokenizer, pristine=True), {"model": cfg.model.path}
    if method == "teacher":
        teacher, step = load_teacher(run, cfg.eval.teacher_step)
        return teacher.trainer.sampler(make_generator(cfg, "eval", None, tokenizer)), {"teacher_step": step}
    candidates = []
    for p in run.promotions:
        path = run.path / p["path"]
        gen = make_generator(cfg, "eval", load_model(OmegaConf.merge(cfg.model, {"path": str(path)})), tokenizer)
        acc = float(np.mean(correctness(gen, grader, hard_train, cfg.data.prompt_template,
                                        s.eval_max_tokens or s.max_tokens, tuple(s.stop), 0)))
        candidates.append((acc, -p["promotion"], gen, p))
    acc, _, gen, best = max(candidates, key=lambda c: c[:2])
    return gen, {"promotion": best["promotion"], "path": best["path"], "hard_train_greedy_acc": acc,
                 "candidates": {c[3]["promotion"]: c[0] for c in candidates}}


def run_eval(cfg) -> dict:
    """The ``soar-eval`` stage; writes ``eval.json`` in the run dir and returns it."""
    ecfg = cfg.eval
    validate_eval(cfg)
    found = {}

    def checks() -> None:  # before the run dir is opened (a soar-train run dir is refused there: soar.run)
        found["run"] = run = read_run(ecfg.run_dir) if ecfg.run_dir else None
        if run is None and ecfg.method in ("pq", "ps", "teacher"):
            raise ConfigError(f"config error: eval.run_dir: method={ecfg.method} needs a soar-train run directory")
        found["hard"] = load_hard_split(cfg, run)
        if ecfg.method not in INFERENCE_METHODS:
            found["synthetic"] = synthetic_questions(cfg, run, found["hard"][1])
        else:
            check_inference_model(cfg, run)

    stage = setup_stage(cfg, "eval", load_base=False, checks=checks)
    run, (hard_train, hard_test, hard_source), rd = found["run"], found["hard"], stage.run
    try:
        tokenizer, grader = stage.tokenizer, make_grader(cfg.data.grader)
        summary = {"method": ecfg.method, "label": ecfg.label or ecfg.method, "seed": cfg.seed,
                   "run_dir": str(run.path) if run else None, "run_id": run.run_id if run else None,
                   "hard_set": hard_source, "hard_train_size": len(hard_train), "hard_test_size": len(hard_test),
                   "samples": ecfg.samples, "ks": list(ecfg.ks)}
        metrics_log = MetricsLogger(rd)
        if ecfg.method in INFERENCE_METHODS:
            gen, info = inference_model(cfg, run, tokenizer, grader, hard_train)
            seeds = [evaluate_solver(gen, grader, hard_test, cfg.data.prompt_template, cfg.student, ecfg,
                                     derive_seed(cfg.seed, "inference", i)) for i in range(ecfg.inference_seeds)]
            for i, row in enumerate(seeds):
                metrics_log.log(i, row)
            mean = {k: float(np.mean([r[k] for r in seeds])) for k in seeds[0]}
            summary.update(info=info, inference_seeds=seeds, selected=mean, final=mean,
                           sd={k: sample_sd([r[k] for r in seeds]) for k in seeds[0]}, questions=0)
        else:
            synthetic, notes = found["synthetic"]
            write_jsonl(rd.path / "questions.jsonl", [p.to_dict() for p in synthetic])
            base = load_model(cfg.model)
            result = train_fresh_student(base, tokenizer, grader, synthetic, hard_train, hard_test, cfg, metrics_log)
            evals, sr = result["evals"], ecfg.slope
            rule = slope_rule(result["train_reward"], sr.window, sr.threshold, sr.fallback_step,
                              slope_rule_first_step(ecfg, synthetic))
            summary.update(notes, mixing=ecfg.mixing if synthetic else "none", questions=len(synthetic),
                           synthetic_frac=ecfg.synthetic_frac, curriculum_steps=ecfg.curriculum_steps,
                           steps=ecfg.steps, warmup_steps=result["warmup_steps"],
                           synthetic_frac_realised=result["synthetic_frac_realised"], evals=evals,
                           train_reward=result["train_reward"], train_accuracy=result["train_accuracy"],
                           slope_rule=asdict(rule), slope=OmegaConf.to_container(sr),
                           selected=window_mean(evals, rule.stop_step, sr.report_steps, ecfg.steps),
                           fixed=at_step(evals, ecfg.fixed_step), before=evals[0], final=evals[-1])
        metrics_log.close()
        (rd.path / "eval.json").write_text(json.dumps(summary, indent=1))
        shown = {k: round(v, 4) for k, v in summary["selected"].items() if k.startswith("eval/")}
        print(json.dumps({"method": summary["label"], "run_dir": str(rd.path), **shown}))
        return summary
    finally:
        stage.close()


def validate_eval(cfg) -> None:
    e = cfg.eval
    if e.method not in TRAINING_METHODS + INFERENCE_METHODS:
        fail("eval.method", f"must be one of {', '.join(TRAINING_METHODS + INFERENCE_METHODS)}, got {e.method!r}")
    if e.mixing not in ("mixed", "curriculum"):
        fail("eval.mixing", f"must be mixed or curriculum, got {e.mixing!r}")
    if e.synthetic_frac is not None and not 0 <= e.synthetic_frac <= 1:
        fail("eval.synthetic_frac", "must be in [0, 1] or null")
    for name in ("steps", "eval_every", "samples", "inference_seeds"):
        if getattr(e, name) < 1:
            fail(f"eval.{name}", f"must be >= 1, got {getattr(e, name)}")
    if not e.ks or any(k < 1 or k > e.samples for k in e.ks):
        fail("eval.ks", f"each k must be in [1, eval.samples={e.samples}], got {list(e.ks)}")
    if not 0 <= e.warmup_steps < e.steps:
        fail("eval.warmup_steps", f"must be in [0, eval.steps={e.steps})")
    if e.slope.window < 2 or not 0 < e.slope.threshold < 1:
        fail("eval.slope", "window must be >= 2 and threshold in (0, 1)")
