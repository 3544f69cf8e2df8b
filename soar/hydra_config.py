"""Hydra's side of the configuration: the schema (``soar.config``) and every world's config class
registered with Hydra's ConfigStore, the resolvers the YAML uses, and ``compose``.

    cfg = soar.compose(["experiment=arith_micro", "seed=1"])

Each world registers itself when ``soar.worlds`` is imported (the package's worlds and those of entry
points); a world's config class is the schema ``<name>_schema`` of the ``world`` group, so
``conf/world/<name>.yaml`` (chosen by ``world=<name>``) is typed and documented by it, and a world outside
the package has its YAML (``World.config_file``) registered as ``world=<name>``.

Composing imports only config code (the schema, the worlds' domain modules, the resolvers' counts): no
torch and no role (``tests/test_config.py`` checks which modules it loads).
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from soar.config import DataConfig, SoarConfig
from soar.data import shared_data_dir
from soar.student_tasks import student_tasks_per_step
from soar.worlds.base import WORLDS


def conf_dir() -> Path:
    """The Hydra config folder: ``soar/conf`` in an installed wheel, ``conf/`` in a checkout."""
    packaged = Path(__file__).resolve().parent / "conf"  # wheel: conf/ is mapped into the package
    if (packaged / "config.yaml").is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "conf"  # checkout or editable install


_registered = False


def register_configs() -> None:
    """Register the schema and every world's config class with Hydra's ConfigStore, and the resolvers
    (idempotent)."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    cs.store(name="soar_schema", node=SoarConfig)
    for name, world in WORLDS.items():
        cs.store(group="world", name=f"{name}_schema", node=world.config_class)
        if world.config_file is not None:  # a world outside the package: its YAML beside its module
            path = world.config_file
            cs.store(group="world", name=name, node=OmegaConf.load(path), package=yaml_package(path))
    if not OmegaConf.has_resolver("soar_data_dir"):  # the benchmark files' folder (data.path)
        OmegaConf.register_new_resolver("soar_data_dir", lambda: str(shared_data_dir()))
    if not OmegaConf.has_resolver("student_tasks"):  # resources.num_workers: one worker per student
        OmegaConf.register_new_resolver("student_tasks", lambda *, _root_: student_tasks_per_step(_root_))
    _registered = True


def yaml_package(path: Path) -> str | None:
    """The package a YAML's ``# @package <name>`` header gives (Hydra reads it from files, not from nodes)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("# @package "):
            return line.removeprefix("# @package ").strip()
        if line.strip() and not line.startswith("#"):
            return None
    return None


def data_group(name: str):
    """The data config ``conf/data/<name>.yaml`` on the schema's defaults (no Hydra run needed, so a
    running command can read several)."""
    register_configs()  # its resolvers (${soar_data_dir:})
    path = conf_dir() / "data" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no data config {name!r}")
    return OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path))


def compose(overrides: list[str] | None = None, config_name: str = "config"):
    """Compose a config without running a CLI, e.g. ``soar.compose(["experiment=arith_micro"])``."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []))
