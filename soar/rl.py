"""``soar-rl``: one student trained with RLOO on a question file, the paper's student recipe (§1.3) on its
own, with resume and metrics.

    soar-rl model.path=PATH data=custom data.path=train.jsonl data.grader=integer \
        student.max_steps=20 run.name=my_rl

Per step: pick ``questions_per_step`` questions (shuffled per epoch from the seed, without
replacement, wrapping: ``soar.students.trainer.batch_indices``) and take one ``RLOOTrainer`` step on them.

With ``distill.coach`` set it is coach-guided on-policy context distillation (``soar.coach``,
``DistillConfig``): a coach advises on every rollout, the advice-conditioned initial policy is the
teacher, and the step's loss adds the per-token reverse KL to it (``experiment=distill_arith``)::

    soar-rl experiment=distill_arith data.path=HARD/hard_train.jsonl data.eval_path=HARD/hard_test.jsonl

On ``soar-filter``'s bands (docs/band_rl.md): ``rl.bands=<filter run dir> rl.band=[mixed]`` trains on
those band files and evaluates on the held-out file; ``rl.eval_samples=n`` scores each held-out problem
by n samples at ``rl.eval_temperature`` instead of greedily (``eval/accuracy``; per source,
``eval/accuracy/source/<source>``, and per band, ``eval/accuracy/band/<band>``, when there are several);
``rl.subset_size=n`` trains on a seeded random n of them (the control arm of a band comparison).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from soar.coach import Advisor, make_coach
from soar.console import progress_bar
from soar.data import DataError, load_problems, render_prompt
from soar.filters.failk import load_band
from soar.grading import make_grader
from soar.metrics_log import MetricsLogger
from soar.models import load_model
from soar.policy.trainer import RLOOTrainer
from soar.run import load_checkpoint_state
from soar.seeding import derive_seed
from soar.stage import setup_stage
from soar.students.trainer import batch_indices

log = logging.getLogger("soar.rl")


def rl_problems(cfg) -> tuple[list, list]:
    """The training and evaluation problems: ``rl.bands``' band files ``rl.band`` and held-out file, else
    ``data.path`` and ``data.eval_path``; the training problems cut to a seeded random ``rl.subset_size``."""
    if cfg.rl.bands is None:
        problems = load_problems(cfg.data)
        eval_problems = load_problems(cfg.data, cfg.data.eval_path) if cfg.data.eval_path else []
    else:
        problems = [p for name in cfg.rl.band for p in load_band(cfg.rl.bands, name, cfg.data)]
        if not problems:
            raise DataError(f"{cfg.rl.bands}: bands {list(cfg.rl.band)} hold no problems (rl.band)")
        eval_problems = load_band(cfg.rl.bands, "heldout", cfg.data)
    return random_subset(problems, cfg.rl.subset_size, cfg.seed), eval_problems


def random_subset(problems: list, size: int | None, seed: int) -> list:
    """``size`` of ``problems`` drawn without replacement from ``seed`` (in their order), all when None;
    more than there are is a ``DataError`` naming ``rl.subset_size``."""
    if size is None:
        return problems
    if size > len(problems):
        raise DataError(f"rl.subset_size={size} but the training problems are only {len(problems)}")
    keep = np.random.default_rng(derive_seed(seed, "rl_subset")).choice(len(problems), size=size, replace=False)
    return [problems[i] for i in sorted(keep)]


def run_rl(cfg) -> dict:
    """The ``soar-rl`` stage: train one student on a question file, with resume and metrics."""
    s, rl = cfg.student, cfg.rl

    def read_questions(stage):  # before the run dir is written
        problems, eval_problems = rl_problems(cfg)
        prompts = [render_prompt(cfg.data.prompt_template, p.question) for p in problems + eval_problems]
        stage.check_prompts(prompts, max(s.max_tokens, s.eval_max_tokens or 0), "student.max_tokens",
                            [p.id for p in problems + eval_problems])
        return problems, eval_problems

    stage = setup_stage(cfg, "rl", prepare=read_questions)
    run, tokenizer, model = stage.run, stage.tokenizer, stage.model
    try:
        problems, eval_problems = stage.prepared
        d = cfg.distill
        frozen_teacher = d.coach is not None and d.teacher == "frozen"
        ref = load_model(cfg.model) if s.lora.r == 0 and (s.kl_coef > 0 or frozen_teacher) else None
        advisor = Advisor(cfg, make_coach(cfg), run.path / "advice") if d.coach is not None else None
        trainer = RLOOTrainer(model, tokenizer, make_grader(cfg.data.grader), s, cfg.data.prompt_template,
                              cfg.seed, ref_model=ref, batch_size=cfg.backend.batch_size,
                              distill=d if advisor is not None else None, advisor=advisor)
        start = 0
        if run.resume_from is not None:
            trainer.load_state_dict(load_checkpoint_state(run.resume_from / "state.pt"))
            start = trainer.step_count
            log.info("resumed from %s (step %d)", run.resume_from, start)
        metrics_log = MetricsLogger(run, resume_step=start if run.resume_from is not None else None)

        def eval_metrics(step: int) -> dict:
            acc = trainer.evaluate(eval_problems, s.eval_max_tokens, rl.eval_samples, derive_seed(cfg.seed, "rl_eval", step),
                                   temperature=rl.eval_temperature)
            out = {"eval/accuracy": float(np.mean(acc))}
            # the recipe holds out problems per source; band files give each held-out problem its band
            for name, key in (("source", lambda p: p.source), ("band", lambda p: p.meta.get("band"))):
                groups: dict[str, list[float]] = {}
                for a, p in zip(acc, eval_problems):
                    groups.setdefault(key(p), []).append(a)
                if len(groups) > 1 and None not in groups:
                    out.update({f"eval/accuracy/{name}/{g}": float(np.mean(v)) for g, v in sorted(groups.items())})
            return out

        if eval_problems and start == 0:
            metrics_log.log(0, eval_metrics(0))
        bar = progress_bar(cfg.run.progress, iterable=range(start, s.max_steps), desc="soar-rl", initial=start,
                           total=s.max_steps, unit="step")
        last = {}
        for step in bar:
            batch = [problems[i] for i in batch_indices(len(problems), step, s.questions_per_step, cfg.seed)]
            trainer.grader.reset_stats()  # grading/* metrics are per step
            result = trainer.step(batch)
            last = dict(result.metrics)
            last.update(trainer.grader.stats.as_metrics())
            done = step + 1
            if eval_problems and (done == s.max_steps or s.eval_every and done % s.eval_every == 0):
                last.update(eval_metrics(done))
            metrics_log.log(done, last)
            bar.set_postfix({k.split("/")[1]: f"{last[k]:.3g}" for k in ("student/reward_mean", "student/accuracy",
                                                                          "sft/teacher_accuracy") if k in last})
            if done % s.save_every == 0 or done == s.max_steps:
                with run.checkpoint(done) as ckpt:
                    torch.save(trainer.state_dict(), ckpt / "state.pt")
        final = run.path / "final"
        trainer.save_pretrained(final)
        summary = {"steps": s.max_steps, "final_dir": str(final), "train_problems": len(problems),
                   "eval_problems": len(eval_problems), "last": last}
        (run.path / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        metrics_log.close()
        return summary
    finally:
        stage.close()
