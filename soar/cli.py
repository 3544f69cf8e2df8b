"""Command-line entry points (Hydra). Every command takes Hydra overrides, e.g.

    soar-filter model=out/world data=problems.jsonl filter.k=128 run.name=hard
    soar-rl model=out/world data=runs/hard/hard_train.jsonl student.max_steps=20 run.name=rl
    soar-world pretrain
    soar-train                                  # experiment=arith: the embedded world end to end

``model=PATH`` and ``data=PATH`` are shorthands for ``model.path=PATH`` and
``data=custom data.path=PATH`` when PATH is not the name of a config in ``conf/``.
"""

from __future__ import annotations

import sys

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

    register_configs()
    sys.argv = [sys.argv[0], *rewrite_shortcuts(sys.argv[1:])]

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name="config")
    def _run(cfg) -> None:
        try:
            stage_fn(cfg)
        except (ConfigError, DataError, LoopError) as exc:
            print(f"soar: {exc}", file=sys.stderr)
            sys.exit(2)

    _run()


def rl_main() -> None:
    from students.trainer import run_rl

    _entry(run_rl)


def filter_main() -> None:
    from filters.failk import run_filter_stage

    _entry(run_filter_stage)


def train_main() -> None:
    """``soar-train``: without ``experiment=...`` it runs the embedded world (``experiment=arith``)."""
    from soar.loop import run_train

    if not any(a.split("=")[0].lstrip("+~") == "experiment" for a in sys.argv[1:]):
        sys.argv.insert(1, "experiment=arith")
    _entry(run_train)


def world_main() -> None:
    from soar.worlds.arith import run_world

    if len(sys.argv) < 2 or sys.argv[1] not in ("pretrain", "problems"):
        print("usage: soar-world pretrain|problems [overrides...]", file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    _entry(lambda cfg: run_world(cfg, command))
