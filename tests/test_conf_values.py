"""Every value lives in one place: the schema (soar/config.py, the paper's defaults) or one file of
conf/. A file may set a key only to a value the key would not have without that file: an experiment
not to its schema default nor to what its parent experiment (``defaults: [arith]``) already sets, a
group file (``conf/data/math500.yaml``) not to the schema's default nor to its parent's. So a group
file that only repeats the schema (the old ``conf/student/paper.yaml``) fails, and changing a default
in the schema changes it everywhere that does not override it on purpose.

"Without that file" is measured, not guessed: a copy of ``conf/`` in which the file keeps only its
defaults list is composed exactly as the file is used, and every key the file sets is compared with
the value it has there, unresolved (``${loop.steps}`` is a value, not what it resolves to)."""

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from soar.hydra_config import conf_dir, register_configs

ROOTS = {"config.yaml": "config", "train.yaml": "train"}
"""Primary configs and the config name they are composed as."""


def compose_in(folder: Path, config_name: str, overrides: list[str]):
    """``soar.compose`` on another config folder (a modified copy of conf/)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def leaves(node, prefix: str = "") -> dict[str, object]:
    """``{dotted key: value}`` of a config body; lists are values."""
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.update(leaves(value, path + ".") if isinstance(value, dict) else {path: value})
    return out


def lookup(container: dict, path: str):
    node = container
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return KeyError  # absent: anything the file sets is new
        node = node[key]
    return node


def how_composed(conf: Path, rel: Path) -> tuple[str, list[str], str]:
    """(config name, overrides, key prefix) that select the file ``rel`` (relative to ``conf``)."""
    if len(rel.parts) == 1:
        return ROOTS[rel.name], [], ""
    group, option = "/".join(rel.parts[:-1]), rel.stem
    if group == "experiment":
        return "train", [f"experiment={option}"], ""
    root_defaults = OmegaConf.to_container(OmegaConf.load(conf / "config.yaml").defaults)
    root_groups = {next(iter(d)) for d in root_defaults if isinstance(d, dict)}
    return "config", [f"{'' if group in root_groups else '+'}{group}={option}"], group.replace("/", ".") + "."


def body_of(conf: Path, rel: Path) -> dict:
    """The keys the file sets (its defaults list and Hydra's own settings are not values of soar's)."""
    body = OmegaConf.to_container(OmegaConf.load(conf / rel), resolve=False) or {}
    return {k: v for k, v in body.items() if k not in ("defaults", "hydra")}


def config_files(conf: Path) -> list[Path]:
    """Every config file but Hydra's launcher configs (the plugins' schemas, not soar's)."""
    return sorted(p.relative_to(conf) for p in conf.rglob("*.yaml") if p.relative_to(conf).parts[0] != "hydra")


def repeated_values(conf: Path, workdir: Path) -> list[str]:
    """One line per key that a file of ``conf`` sets to the value it has without that file."""
    problems = []
    for rel in config_files(conf):
        body = body_of(conf, rel)
        if not body:
            continue
        config_name, overrides, prefix = how_composed(conf, rel)
        bare = workdir / rel.as_posix().replace("/", "__")
        shutil.rmtree(bare, ignore_errors=True)
        shutil.copytree(conf, bare)
        text = (conf / rel).read_text()
        header = [line for line in text.splitlines() if line.startswith("# @package")]
        defaults = OmegaConf.load(conf / rel).get("defaults")
        kept = {"defaults": OmegaConf.to_container(defaults)} if defaults is not None else {}
        (bare / rel).write_text("\n".join(header) + "\n" + (OmegaConf.to_yaml(kept) if kept else ""))
        without = OmegaConf.to_container(compose_in(bare, config_name, overrides), resolve=False)
        for key, value in leaves(body).items():
            if lookup(without, prefix + key) == value:
                problems.append(f"conf/{rel}: {prefix}{key} = {value!r} is already its value without this file")
    return problems


def test_no_config_file_repeats_a_value_it_inherits(tmp_path):
    assert repeated_values(conf_dir(), tmp_path) == []


@pytest.mark.parametrize("rel, addition, expected", [
    # an experiment repeating the schema's default (fail@128 is the schema's k)
    ("experiment/arith.yaml", "filter:\n  k: 128\n", "conf/experiment/arith.yaml: filter.k = 128"),
    # an experiment repeating its parent experiment (arith_micro inherits arith's oracle)
    ("experiment/arith_micro.yaml", "loop:\n  answer_oracle: world\n",
     "conf/experiment/arith_micro.yaml: loop.answer_oracle = 'world'"),
    # a group file that only repeats the schema (the paper's student recipe)
    ("student/paper.yaml", "questions_per_step: 8\ngroup_size: 32\n",
     "conf/student/paper.yaml: student.group_size = 32"),
    # a group file repeating its parent option (math500 inherits math's grader)
    ("data/math500.yaml", "problem_key: problem\n", "conf/data/math500.yaml: data.problem_key = 'problem'"),
])
def test_a_repeated_value_is_found(tmp_path, rel, addition, expected):
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    path = conf / rel
    path.parent.mkdir(exist_ok=True)
    text = path.read_text() if path.exists() else ""
    # a second top-level block of an existing key would be a YAML error: merge into the loaded body
    merged = OmegaConf.merge(OmegaConf.load(path) if path.exists() else OmegaConf.create(), OmegaConf.create(addition))
    header = [line for line in text.splitlines() if line.startswith("# @package")]
    path.write_text("\n".join(header) + "\n" + OmegaConf.to_yaml(merged))
    problems = repeated_values(conf, tmp_path / "work")
    assert any(p.startswith(expected) for p in problems), problems
