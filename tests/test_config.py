"""Configuration: paper defaults, validation messages naming the field, run-dir lock, CLI
shorthands, and the shipped conf/ after a non-editable install."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import soar
from soar.cli import rewrite_shortcuts
from soar.config import ConfigError
from soar.validation import validate

pytestmark = pytest.mark.timeout(300)


def cfg_with(*overrides, tmp_path=None):
    base = ["model.path=org/model", "data.path=org/data"]
    return soar.compose([*base, *overrides])


def test_paper_defaults_from_table_3():
    cfg = cfg_with()
    s, f = cfg.student, cfg.filter
    assert (s.questions_per_step, s.group_size, s.lr, s.kl_coef, s.temperature, s.max_tokens) == \
        (8, 32, 1e-5, 0.001, 1.0, 1024)
    assert (s.max_steps, s.warmup_steps, s.lora.r) == (10, 0, 0)
    assert (f.k, f.temperature, f.max_tokens, f.test_frac) == (128, 1.0, 1024, 0.5)
    assert "\\boxed{}" in cfg.data.prompt_template and "{question}" in cfg.data.prompt_template


@pytest.mark.parametrize("override, field", [
    ("student.group_size=1", "student.group_size"),
    ("student.questions_per_step=0", "student.questions_per_step"),
    ("student.loss_norm=mean", "student.loss_norm"),
    ("student.warmup_steps=10", "student.warmup_steps"),
    ("run.threads=4096", "run.threads"),
    ("run.resume=sometimes", "run.resume"),
    ("data.prompt_template=no_slot", "data.prompt_template"),
    ("data.path=/nonexistent/file.jsonl", "data.path"),
    ("model.path=/nonexistent/model", "model.path"),
    ("data.on_bad_row=ignore", "data.on_bad_row"),
])
def test_rl_validation_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(cfg_with(override), "rl")


@pytest.mark.parametrize("override, field", [
    ("filter.k=0", "filter.k"), ("filter.test_frac=1.0", "filter.test_frac"),
    ("filter.temperature=0", "filter.temperature"),
    ("filter.heldout_per_source=-1", "filter.heldout_per_source"),
    ("filter.heldout_frac=1.0", "filter.heldout_frac"), ("filter.heldout_frac=-0.1", "filter.heldout_frac"),
])
def test_filter_validation_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        validate(cfg_with(override), "filter")


def test_heldout_frac_and_per_source_are_exclusive():
    validate(cfg_with("filter.heldout_frac=0.2"), "filter")
    with pytest.raises(ConfigError, match=r"filter\.heldout_frac.*filter\.heldout_per_source=25.*set one"):
        validate(cfg_with("filter.heldout_frac=0.2", "filter.heldout_per_source=25"), "filter")


def test_hydra_rejects_unknown_fields():
    with pytest.raises(Exception, match="student.not_a_field|not_a_field"):
        cfg_with("student.not_a_field=1")


def test_context_check_message():
    from soar.models import build_char_tokenizer, check_context

    tok = build_char_tokenizer()
    check_context(tok, ["x" * 100], 900, 1024, "student.max_tokens")
    with pytest.raises(ConfigError, match=r"student\.max_tokens.*100 tokens.*1100.*exceeds the model context \(1024\)"):
        check_context(tok, ["x" * 100], 1000, 1024, "student.max_tokens")


def test_run_dir_lock_and_resume_must(tmp_path):
    from soar.run import RunDir

    cfg = cfg_with(f"run.dir={tmp_path / 'r'}")
    first = RunDir(cfg, "rl")
    with pytest.raises(ConfigError, match="is in use by pid"):
        RunDir(cfg, "rl")
    first.close()
    RunDir(cfg, "rl").close()  # lock released
    with pytest.raises(ConfigError, match="run.resume=must"):
        RunDir(cfg_with(f"run.dir={tmp_path / 'r'}", "run.resume=must"), "rl")


def test_cli_shorthands():
    assert rewrite_shortcuts(["model=/m", "data=x.jsonl", "data=custom", "seed=1"]) == [
        "model.path=/m", "data=custom", "data.path=x.jsonl", "data=custom", "seed=1"]
    assert rewrite_shortcuts(["model=llama3.2-3b"]) == ["model=llama3.2-3b"]


def test_non_editable_install_ships_conf(tmp_path):
    """``pip install .`` into a fresh venv; the packaged conf/ is found from another directory."""
    repo = Path(__file__).resolve().parent.parent
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        import site

        # Inside a virtualenv, --system-site-packages sees the base interpreter's packages, not the
        # active venv's (torch, transformers, ...): list the active environment's site dirs in a .pth.
        purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        Path(purelib, "_active_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    # Build the wheel with the base interpreter's setuptools, install it without deps: the
    # dependencies already sit in the base environment the venv can see. --force-reinstall: a soar
    # installed there (say, editable from another checkout) must not count as "already satisfied".
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(repo)], check=True, timeout=240, cwd=tmp_path, capture_output=True)
    wheel = next((tmp_path / "dist").glob("soar-*.whl"))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, timeout=240, cwd=tmp_path, capture_output=True)
    probe = ("import soar, sys; from soar.hydra_config import conf_dir; c = conf_dir(); "
             "print(soar.__file__); print(c); assert (c / 'experiment' / 'arith.yaml').is_file(); "
             "from soar.worlds.arith import SHIPPED; assert any(SHIPPED.glob('arith-*/model.safetensors')), SHIPPED")
    out = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    soar_file, conf = out.stdout.split()
    assert str(venv) in soar_file and str(venv) in conf, out.stdout
    res = subprocess.run([str(venv / "bin" / "soar-rl"), "model.path=org/m", "data.path=org/d", "--cfg", "job"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "group_size: 32" in res.stdout


ROLE_MODULES = ("torch", "transformers", "peft", "vllm", "ray", "soar.students", "soar.teachers", "soar.policy",
                "soar.team", "soar.vllm_backend", "soar.stacked_llama", "soar.models", "soar.generation")
"""What composing a config must not import: torch, the model libraries and the package's role code (issue 61)."""


def modules_loaded(code: str) -> list[str]:
    """The ``ROLE_MODULES`` a fresh interpreter has imported once ``code`` ran (also when it exits)."""
    probe = ("import atexit, sys\n"
             f"ROLE_MODULES = {ROLE_MODULES!r}\n"
             "atexit.register(lambda: print('LOADED', sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') "
             "for p in ROLE_MODULES)), flush=True))\n" + code)
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return eval(res.stdout.rsplit("LOADED ", 1)[1])  # a list of names printed by the probe itself


def test_composing_a_config_imports_no_torch_and_no_role():
    """``soar.compose`` loads config code only: the schema, the worlds' domain modules, the resolvers' counts."""
    code = ("import soar\nfrom omegaconf import OmegaConf\n"
            "for name in ('arith_micro', 'paper_math', 'team_scr_arith_micro', 'distill_arith'):\n"
            "    cfg = soar.compose([f'experiment={name}', 'model.path=/m'])\n"
            "    OmegaConf.to_container(cfg.resources, resolve=True)  # the ${student_tasks:} resolver\n")
    assert modules_loaded(code) == []


@pytest.mark.parametrize("command, args", [
    ("train_main", ["experiment=arith_micro"]), ("team_main", ["experiment=team_scr_arith_micro"]),
    ("world_main", ["pretrain", "world=arith_team_micro"]), ("estimate_main", ["--plan", "experiment=paper_math"]),
    ("estimate_main", ["--plan", "--stage", "rl", "experiment=band_rl"]),
])
def test_cfg_job_imports_no_torch_and_no_role(command, args):
    """Any command's ``--cfg job`` (here ``soar-train experiment=arith_micro --cfg job`` and others) composes and
    prints the config without importing its stage."""
    code = (f"import sys\nsys.argv = ['soar', *{args!r}, '--cfg', 'job']\n"
            f"from soar.cli import {command}\n{command}()\n")
    assert modules_loaded(code) == []
