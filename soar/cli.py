"""Command-line entry points (Hydra). Every command takes Hydra overrides, e.g.

    soar-filter model=out/world data=problems.jsonl filter.k=128 run.name=hard
    soar-rl model=out/world data=runs/hard/hard_train.jsonl student.max_steps=20 run.name=rl
    soar-team experiment=team_scr_arith_micro   # a team of roles trained with RL (docs/team.md)
    soar-world pretrain
    soar-train                                  # experiment=arith: the embedded world end to end
    soar-estimate --calibration-steps 2         # projected hours of that run, from 2 outer steps
    soar-estimate --plan experiment=paper_math model.path=DIR   # each GPU's memory, before launch
    soar-estimate --plan --stage rl experiment=band_rl model.path=DIR   # soar-rl's GPUs (also eval, filter)
    soar-estimate --layout experiment=paper_math_lora backend=vllm   # a run's GPU-hours on its layout, from stated costs
    soar-export runs/arith export.samples=128   # PQ + 128 fresh teacher questions + models
    soar-eval experiment=arith eval.method=pq eval.run_dir=runs/arith run.name=eval_pq_s0
    soar-report runs/arith --evals runs/eval_* --out runs/report

``model=PATH`` and ``data=PATH`` are shorthands for ``model.path=PATH`` and
``data=custom data.path=PATH`` when PATH is not the name of a config in ``conf/``.

``soar-train`` and ``soar-estimate`` compose ``conf/train.yaml`` (the root ``config.yaml`` with
``experiment=arith`` as its default); the other commands compose ``conf/config.yaml``. Each command
turns its own arguments (positional ones, shorthands) into Hydra overrides, and ``_entry`` hands
them to Hydra, the one place ``sys.argv`` is set.

Each command imports its stage (torch, the roles) inside the function Hydra runs, after composing: so
``--cfg job``, ``--help`` and a bad override load only config code. These and the package API
(``soar/__init__.py``) are the package's only imports inside functions, besides a world's model build.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf.errors import OmegaConfBaseException

from soar.config import ConfigError
from soar.data import DataError
from soar.hydra_config import conf_dir, register_configs
from soar.signals import EXIT_INTERRUPTED, EXIT_STOPPED, StoppedDuringSetup
from soar.worlds.base import configured_world


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


def _entry(stage_fn, args: list[str] | None = None, config_name: str = "config") -> None:
    """Run ``stage_fn`` under Hydra on ``args`` (default: the command line) composed onto
    ``conf/<config_name>.yaml``. A user or environment error (bad config, data, run dir, a full
    disk) prints one line, ``soar: ...``, and exits 2; a traceback is printed only for bugs, or for
    every error with ``--verbose`` or ``HYDRA_FULL_ERROR=1``. ``--verbose`` also shows soar's DEBUG
    logs (as Hydra's ``hydra.verbose=soar`` does): every metric of each ``soar-train`` step, not one line.
    Log lines print above the progress bars on a terminal (``soar.console.console_above_bars``)."""
    register_configs()
    # conf/hydra/launcher/submitit_slurm.yaml lists every field of the plugin's schema of that name
    warnings.filterwarnings("ignore", message="(?s).*is validated against ConfigStore schema", category=UserWarning)
    args = sys.argv[1:] if args is None else args
    verbose = "--verbose" in args or os.environ.get("HYDRA_FULL_ERROR") == "1"
    debug_logs = "--verbose" in args
    sys.argv = [sys.argv[0], *rewrite_shortcuts([a for a in args if a != "--verbose"])]  # hydra.main reads argv

    refused: list[str] = []  # a sweep's refused jobs

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name=config_name)
    def _run(cfg) -> None:
        from soar.console import console_above_bars  # composed: the stage runs

        if debug_logs:  # after Hydra has configured logging (as hydra.verbose=soar would)
            logging.getLogger("soar").setLevel(logging.DEBUG)
        run_dir = Path(cfg.run.dir or Path("runs") / cfg.run.name)
        try:
            with console_above_bars():  # Hydra's console handler, now configured: log lines above the bars
                stage_fn(cfg)
        except Exception as exc:
            message = stage_error_message(exc, run_dir)
            job = _sweep_job()
            if message is not None and job is not None and not verbose:  # the sweep's other jobs still run
                refused.append(job)
                print(f"soar: sweep job {job} refused: " + " ".join(message.split()), file=sys.stderr, flush=True)
                raise SweepJobRefused(message) from None
            _exit_if_user_error(message, verbose)
            raise
        except (KeyboardInterrupt, StoppedDuringSetup) as exc:
            _exit_stopped(exc, run_dir, verbose)

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises composition errors instead of printing them
    try:
        _run()
    except SweepJobRefused:  # raised once every job of the sweep has run
        print(f"soar: {len(refused)} sweep job(s) refused ({', '.join(refused)}), each named above; the others ran",
              file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as exc:  # composing the config failed: a bad override
        cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
        _exit_if_user_error(f"config error: {exc}" + (f" ({cause})" if cause else ""), verbose)
        raise
    except KeyboardInterrupt as exc:  # before the stage started: nothing written
        _exit_stopped(exc, None, verbose)


class SweepJobRefused(Exception):
    """A job of a ``-m`` sweep refused with a user error: Hydra records it as failed and runs the other
    jobs (an exit would end the sweep there), then raises the first such error."""


def _sweep_job() -> str | None:
    """``#N (overrides)`` of the running Hydra multirun job, None outside a sweep."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    return f"#{hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)})"


def _exit_stopped(exc: BaseException, run_dir: Path | None, verbose: bool) -> None:
    """Ctrl-C (``KeyboardInterrupt``), or a stop signal during setup (``StoppedDuringSetup``): one line
    saying what happened and where a rerun resumes, then exit 130 or 75 (``soar.signals``); the
    traceback only with ``verbose``."""
    if verbose:
        raise exc
    from soar.run import latest_checkpoint

    ckpt = latest_checkpoint(run_dir / "checkpoints") if run_dir is not None else None
    if run_dir is None:
        resume = "nothing was written"
    elif ckpt is not None:
        resume = f"rerun the same command to resume from its last checkpoint, {ckpt.resolve()}"
    else:
        resume = f"no checkpoint in {run_dir} yet: rerun the same command to start again (a fail@k manifest keeps " \
                 "its finished batches)"
    if isinstance(exc, StoppedDuringSetup):
        what, code = f"stopped by {exc.signal_name} during setup, before this command's first outer step", EXIT_STOPPED
    else:
        what, code = "interrupted (SIGINT)", EXIT_INTERRUPTED
    print(f"soar: {what}; {resume}; exit {code}", file=sys.stderr, flush=True)
    sys.exit(code)


def _exit_if_user_error(message: str | None, verbose: bool) -> None:
    """Print ``soar: <message>`` on one line and exit 2, unless it is a bug (None) or ``verbose``."""
    if message is None or verbose:
        return
    print("soar: " + " ".join(message.split()), file=sys.stderr)
    sys.exit(2)


def stage_error_message(exc: Exception, run_dir: Path) -> str | None:
    """What to tell the user about ``exc``, raised by a stage writing to ``run_dir``; None for a bug
    (which deserves its traceback)."""
    from soar.loop import LoopError  # the stage that raised ``exc`` has imported them all
    from soar.run import RunDirError, disk_full
    from soar.rundata import RunDataError
    from soar.vllm_backend import EngineStartError

    if isinstance(exc, (ConfigError, DataError, LoopError, RunDataError, RunDirError, EngineStartError)):
        return str(exc)
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: cannot write {exc.filename or run_dir} ({exc.strerror}); free space, then rerun the " \
               "same command to resume"
    # some writers report a full disk in an error of their own: torch.save a bare RuntimeError (its
    # partial file left, so the disk is still full), safetensors a SafetensorError naming os error 28
    if disk_full(run_dir) or os.strerror(errno.ENOSPC) in str(exc):
        return f"disk full under {run_dir} ({type(exc).__name__}: {exc}); free space, then rerun the same command " \
               "to resume"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot access {exc.filename or run_dir}: {exc.strerror}"
    return None


def rl_main() -> None:
    def stage(cfg):
        from soar.rl import run_rl

        return run_rl(cfg)

    _entry(stage)


def team_main() -> None:
    """``soar-team [overrides...]``: a chain of roles trained with RL (docs/team.md), e.g.
    ``soar-team experiment=team_scr_arith_micro``."""
    def stage(cfg):
        from soar.team.train import run_team

        return run_team(cfg)

    _entry(stage)


def filter_main() -> None:
    def stage(cfg):
        from soar.filters.failk import run_filter_stage

        return run_filter_stage(cfg)

    _entry(stage)


def train_main() -> None:
    """``soar-train``: without ``experiment=...`` it runs the embedded world (``conf/train.yaml``'s
    default, ``experiment=arith``)."""
    def stage(cfg):
        from soar.loop import run_train

        return run_train(cfg)

    _entry(stage, config_name="train")


def estimate_main() -> None:
    """``soar-estimate [--calibration-steps N] [overrides...]``: a full run's projected cost from N
    outer steps (default 1); without ``experiment=...`` it estimates ``experiment=arith``.
    ``soar-estimate --plan [--stage train|rl|eval|filter] [--prompt-tokens N] [overrides...]``: the GPU
    memory plan of that stage's config instead (no run; default train).
    ``soar-estimate --layout [--inputs FILE] [--promotions N] [overrides...]``: the allocated GPU-hours of a
    full run on the config's layout, from measured and assumed per-phase costs (no run)."""
    usage = ("usage: soar-estimate [--calibration-steps N | --plan [--stage train|rl|eval|filter] [--prompt-tokens N] | "
             "--layout [--inputs FILE] [--promotions N]] [overrides...]")
    numbers = {"--calibration-steps": 1, "--prompt-tokens": None, "--promotions": None}
    texts = {"--stage": "train", "--inputs": None}
    mode, args = "estimate", []
    argv = iter(sys.argv[1:])
    for arg in argv:
        name = arg.partition("=")[0]
        if name in numbers or name in texts:
            value = arg.partition("=")[2] or next(argv, "")
            if name in numbers and value.isdigit():
                numbers[name] = int(value)
            elif name == "--stage" and value in plan_stages() or name == "--inputs" and value:
                texts[name] = value
            else:
                print(usage, file=sys.stderr)
                sys.exit(2)
        elif arg in ("--plan", "--layout"):
            mode = arg[2:]
        else:
            args.append(arg)

    def stage(cfg):
        from soar.estimate import run_estimate, run_layout, run_plan

        if mode == "plan":
            tokens = {} if numbers["--prompt-tokens"] is None else {"prompt_tokens": numbers["--prompt-tokens"]}
            return run_plan(cfg, stage=texts["--stage"], **tokens)
        if mode == "layout":
            return run_layout(cfg, texts["--inputs"], numbers["--promotions"])
        return run_estimate(cfg, numbers["--calibration-steps"])

    _entry(stage, args, config_name="train")


def plan_stages() -> tuple[str, ...]:
    """The stages ``soar-estimate --plan --stage`` sizes (``soar.memory_plan.STAGES``)."""
    from soar.memory_plan import STAGES

    return STAGES


def world_main() -> None:
    """``soar-world pretrain|problems [overrides...]``: the configured world's command (``world=<name>``).

    ``pretrain`` builds the world model (``World.pretrain``: into the cache or ``world.out_dir``, even when the
    package ships it; never into a folder of other files); ``problems`` writes the world's problem files
    (``World.problem_files``) to its own run dir (``soar.run.RunDir``, stage ``world``: a new or empty folder,
    or its own run with the same settings; never another command's run, such as a soar-train run's
    ``problems/``). Both print what they wrote."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("pretrain", "problems"):
        print("usage: soar-world pretrain|problems [overrides...]", file=sys.stderr)
        sys.exit(2)
    _entry(world_pretrain if sys.argv[1] == "pretrain" else world_problems, sys.argv[2:])


def world_pretrain(cfg) -> None:
    """``soar-world pretrain``: the configured world's model, built; prints its folder."""
    print(configured_world(cfg).pretrain(cfg))


def world_problems(cfg) -> None:
    """``soar-world problems``: the configured world's problem files in this command's run dir; prints them as
    JSON (name -> path)."""
    from soar.run import RunDir

    run = RunDir(cfg, "world")
    try:
        run.commit()
        files = configured_world(cfg).problem_files(cfg, run.path)
        print(json.dumps({name: str(path) for name, path in files.items()}))
    finally:
        run.close()


def export_main() -> None:
    """``soar-export RUN_DIR [overrides...]``: PQ, teacher samples and models of a finished run."""
    if len(sys.argv) < 2 or "=" in sys.argv[1] or sys.argv[1].startswith("-"):
        print("usage: soar-export RUN_DIR [export.samples=128 export.teacher_step=N pq.allow_ineligible=true ...]",
              file=sys.stderr)
        sys.exit(2)
    def stage(cfg):
        from soar.export import run_export

        return run_export(cfg)

    _entry(stage, [f"export.run_dir={sys.argv[1]}", *sys.argv[2:]])


def eval_main() -> None:
    """``soar-eval [overrides...]``: one fresh-student (or inference-only) evaluation, e.g.
    ``soar-eval experiment=arith eval.method=hard_only eval.run_dir=runs/arith run.name=eval_ho_s0``."""
    def stage(cfg):
        from soar.evaluate import run_eval

        return run_eval(cfg)

    _entry(stage)


def report_main() -> None:
    """``soar-report RUN_DIR... [--evals EVAL_DIR...] [--out DIR]``: plots and a Markdown page."""
    from soar.report import main

    main()
