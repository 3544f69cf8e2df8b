"""Command-line entry points (Hydra). Every command takes Hydra overrides, e.g.

    soar-filter model=out/world data=problems.jsonl filter.k=128 run.name=hard
    soar-rl model=out/world data=runs/hard/hard_train.jsonl student.max_steps=20 run.name=rl
    soar-world pretrain
    soar-train                                  # experiment=arith: the embedded world end to end
    soar-estimate --calibration-steps 2         # projected hours of that run, from 2 outer steps
    soar-export runs/arith export.samples=128   # PQ + 128 fresh teacher questions + models
    soar-eval experiment=arith eval.method=pq eval.run_dir=runs/arith run.name=eval_pq_s0
    soar-report runs/arith --evals runs/eval_* --out runs/report

``model=PATH`` and ``data=PATH`` are shorthands for ``model.path=PATH`` and
``data=custom data.path=PATH`` when PATH is not the name of a config in ``conf/``.
"""

from __future__ import annotations

import sys
import warnings

from soar.config import ConfigError, conf_dir, register_configs


def rewrite_shortcuts(args: list[str]) -> list[str]:
    """Turn ``model=PATH`` / ``data=PATH`` into field overrides unless PATH names a config."""
    out = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in ("model", "data") and not (conf_dir() / key / f"{value}.yaml").exists():
            out += [f"{key}.path={value}"] if key == "model" else ["data=custom", f"data.path={value}"]
        else:
            out.append(arg)
    return out


def _entry(stage_fn) -> None:
    import hydra

    from soar.data import DataError
    from soar.loop import LoopError
    from soar.rundata import RunDataError

    register_configs()
    # conf/hydra/launcher/submitit_slurm.yaml lists every field of the plugin's schema of that name
    warnings.filterwarnings("ignore", message="(?s).*is validated against ConfigStore schema", category=UserWarning)
    sys.argv = [sys.argv[0], *rewrite_shortcuts(sys.argv[1:])]

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")
    def _run(cfg) -> None:
        try:
            stage_fn(cfg)
        except (ConfigError, DataError, LoopError, RunDataError) as exc:
            print(f"soar: {exc}", file=sys.stderr)
            sys.exit(2)

    _run()


def rl_main() -> None:
    from students.trainer import run_rl

    _entry(run_rl)


def filter_main() -> None:
    from filters.failk import run_filter_stage

    _entry(run_filter_stage)


def with_default_experiment(args: list[str]) -> list[str]:
    """``args`` with ``experiment=arith`` (the embedded world) first unless they choose an experiment."""
    if any(a.split("=")[0].lstrip("+~") == "experiment" for a in args):
        return args
    return ["experiment=arith", *args]


def train_main() -> None:
    """``soar-train``: without ``experiment=...`` it runs the embedded world (``experiment=arith``)."""
    from soar.loop import run_train

    sys.argv = [sys.argv[0], *with_default_experiment(sys.argv[1:])]
    _entry(run_train)


def estimate_main() -> None:
    """``soar-estimate [--calibration-steps N] [overrides...]``: a full run's projected cost from N
    outer steps (default 1); without ``experiment=...`` it estimates ``experiment=arith``."""
    from soar.estimate import run_estimate

    steps, args = 1, []
    argv = iter(sys.argv[1:])
    for arg in argv:
        if arg == "--calibration-steps" or arg.startswith("--calibration-steps="):
            value = arg.partition("=")[2] or next(argv, "")
            if not value.isdigit():
                print("usage: soar-estimate [--calibration-steps N] [overrides...]", file=sys.stderr)
                sys.exit(2)
            steps = int(value)
        else:
            args.append(arg)
    sys.argv = [sys.argv[0], *with_default_experiment(args)]
    _entry(lambda cfg: run_estimate(cfg, steps))


def world_main() -> None:
    from soar.worlds.arith import run_world

    if len(sys.argv) < 2 or sys.argv[1] not in ("pretrain", "problems"):
        print("usage: soar-world pretrain|problems [overrides...]", file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    _entry(lambda cfg: run_world(cfg, command))


def export_main() -> None:
    """``soar-export RUN_DIR [overrides...]``: PQ, teacher samples and models of a finished run."""
    from soar.export import run_export

    if len(sys.argv) < 2 or "=" in sys.argv[1] or sys.argv[1].startswith("-"):
        print("usage: soar-export RUN_DIR [export.samples=128 export.teacher_step=N pq.allow_ineligible=true ...]",
              file=sys.stderr)
        sys.exit(2)
    sys.argv[1] = f"export.run_dir={sys.argv[1]}"
    _entry(run_export)


def eval_main() -> None:
    """``soar-eval [overrides...]``: one fresh-student (or inference-only) evaluation, e.g.
    ``soar-eval experiment=arith eval.method=hard_only eval.run_dir=runs/arith run.name=eval_ho_s0``."""
    from soar.evaluate import run_eval

    _entry(run_eval)


def report_main() -> None:
    """``soar-report RUN_DIR... [--evals EVAL_DIR...] [--out DIR]``: plots and a Markdown page."""
    from soar.report import main

    main()
