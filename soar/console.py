"""What a stage shows on the console: ``soar-train``'s line per outer step (``outer_step_line``) and its
closing summary (``train_summary_text``), counted nouns (``plural``), and progress bars that draw only on a
terminal (``progress_bar``) with log lines above them (``console_above_bars``). The lines go through the
``soar`` logger (``soar.metrics_log.MetricsLogger``) or ``print``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


def outer_step_line(step: int, metrics: dict[str, Any], cfg) -> str:
    """An outer step of ``soar-train`` as one console line: the dataset rewards (mean and best over
    the step's datasets, in ``inner.reward_metric``'s units), the teacher's valid fraction and, where
    the world has an answer oracle, the share of its answers that are right, the moving average
    against tau, promotions so far and the step's wall time, e.g.

        step 2/3 | reward mean +0.0625 best +0.1250 | teacher valid 0.75, answers right 0.25 |
        moving avg -0.0781 vs tau -1 | promotions 1 | 107.5 s
    """
    teacher = f"teacher valid {metrics['teacher/valid_frac']:.2f}"
    if "teacher/answer_correct_frac" in metrics:
        teacher += f", answers right {metrics['teacher/answer_correct_frac']:.2f}"
    average = metrics["promotion/moving_average"]  # None while the window fills (and after a reset)
    promotion = (f"moving avg {'-' if average is None else format(average, '+.4f')} vs tau {cfg.promotion.tau:g}"
                 if cfg.promotion.enabled else "promotion off")
    return " | ".join([
        f"step {step}/{cfg.loop.steps}",
        f"reward mean {metrics['teacher/reward_mean']:+.4f} best {metrics['teacher/reward_max']:+.4f}",
        teacher, promotion, f"promotions {metrics['promotion/count']}", f"{metrics['time/step_wall_s']:.1f} s"])


def plural(n: int, noun: str) -> str:
    """``1 promotion``, ``2 promotions``."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def train_summary_text(summary: dict[str, Any]) -> str:
    """The end of a ``soar-train`` run as a few lines naming what it wrote, e.g.

        soar-train: 3 outer steps, 1 promotion, 8 Promotion Questions in /runs/x/pq.jsonl
          promotion 1 at step 2: /runs/x/promoted/promotion_01 (greedy accuracy on hard train 0.250, hard test 0.125)
          metrics: /runs/x/metrics.jsonl; summary: /runs/x/summary.json
    """
    run = Path(summary["run_dir"])
    lines = [f"soar-train: {plural(summary['steps'], 'outer step')}, {plural(len(summary['promotions']), 'promotion')}, "
             f"{plural(summary['pq_size'], 'Promotion Question')} in {run / 'pq.jsonl'}"]
    for p in summary["promotions"]:
        lines.append(f"  promotion {p['promotion']} at step {p['step']}: {run / p['path']} (greedy accuracy on hard train "
                     f"{p['hard_train_acc']:.3f}, hard test {p['hard_test_acc']:.3f})")
    lines.append(f"  metrics: {run / 'metrics.jsonl'}; summary: {run / 'summary.json'}")
    return "\n".join(lines)


def progress_bar(enabled: bool = True, **kwargs) -> tqdm:
    """A tqdm bar (``kwargs``: tqdm's) shown only where it can redraw itself: with ``enabled``
    (``run.progress``) and stderr a terminal. Redirected to a file or a pipe it shows nothing (tqdm's
    ``disable=None``), so a log holds the step lines alone, one a line, and no bar frames."""
    return tqdm(disable=None if enabled else True, **kwargs)


def console_above_bars():
    """Route console log records through ``tqdm.write`` (``tqdm.contrib.logging.logging_redirect_tqdm``):
    on a terminal a log line clears the bars, prints on a line of its own and redraws them below it,
    instead of being glued to a bar's last frame."""
    return logging_redirect_tqdm(tqdm_class=tqdm)
