"""The step dump, ``steps/step_N.json``: what an outer step of ``soar-train`` saw and decided (each dataset's
questions with R_k, A_k, its replicates' rewards and where each student ran; the promotion decision) and
a few greedy completions of the median student of the best dataset on Q_R."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from soar.data import render_prompt
from soar.generation import SamplingParams
from soar.students.promotion import median_replicate


def start_completions(cfg, template: str, t: int, qr, results, rewards_KR) -> Callable[[], list[dict]]:
    """Start the step dump's greedy completions of the median student of the best dataset on the
    first ``loop.dump_completions`` Q_R questions (every ``loop.dump_every`` steps); returns a
    function that gives them. A pool student generates in its worker, on a thread here, while
    the driver updates the teacher; others generate now."""
    g = cfg.teacher.datasets
    if not (results[0].students_KR and cfg.loop.dump_completions and (t + 1) % cfg.loop.dump_every == 0):
        return lambda: []
    bi, bk = divmod(int(np.argmax(rewards_KR.mean(-1))), g)
    best = results[bi].students_KR[bk][median_replicate(rewards_KR[bi * g + bk])]
    few = qr[: cfg.loop.dump_completions]
    sampler = best.trainer.sampler()
    prompts = [render_prompt(template, p.question) for p in few]
    params = SamplingParams(greedy=True, max_tokens=cfg.student.max_tokens)

    def rows(outs) -> list[dict]:
        return [{"question": p.question, "gold": p.answer, "completion": o[0].text} for p, o in zip(few, outs)]

    if getattr(sampler, "generates_in_worker", False):
        pool = ThreadPoolExecutor(1, thread_name_prefix="soar-dump")
        future = pool.submit(sampler.generate, prompts, params)
        pool.shutdown(wait=False)  # the thread ends with the job
        return lambda: rows(future.result())
    outs = sampler.generate(prompts, params)
    return lambda: rows(outs)


def write_step_dump(run_path: Path, cfg, t: int, datasets_JK, rewards_KR, adv_JK, results, decision, record,
                    completions: list[dict]) -> None:
    """``steps/step_N.json``: questions with R_k, A_k, replicate rewards and where each student ran
    (pid, Ray node id), and ``completions`` (``start_completions``)."""
    g, rows = cfg.teacher.datasets, []
    for gi, ds in enumerate(datasets_JK):
        for k, d in enumerate(ds):
            kk = gi * g + k
            rows.append({"dataset": kk, "reward": float(rewards_KR[kk].mean()), "advantage": float(adv_JK[gi][k]),
                         "replicate_rewards": rewards_KR[kk].tolist(),
                         "students": [s.worker for s in results[gi].students_KR[k]] if results[gi].students_KR else [],
                         "questions": [{"question": p.question, "answer": p.answer} for p in d]})
    out = run_path / "steps"
    out.mkdir(exist_ok=True)
    (out / f"step_{t + 1:06d}.json").write_text(json.dumps(
        {"step": t + 1, "datasets": rows, "decision": decision.to_dict(), "promotion": record,
         "student_completions": completions}, indent=1))
