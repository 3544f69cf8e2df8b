"""The arithmetic world: the carry sampler, problem families, teacher format, deterministic pretraining; the
World interface, and a world outside the package (``tests/worlds``)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import soar
from soar.teachers import Pair, format_pair, parse_pair
from soar.worlds.arith import ArithWorldConfig, carries_of, family_problems, lsb, make_problem, sample_pair, world_hash
from soar.worlds.arith_pretrain import loss_backward, pretrain, teacher_completion

from conftest import run_cli, script

pytestmark = pytest.mark.timeout(300)

PLAIN = dict(teacher_frac=0.2, teacher_carry_weights=None, teacher_carries="none", padded_batches=False)
"""A plain tiny world for the pretraining tests: a 20 % teacher share on the student's carry mix, no
carry plan, one pass per sequence length (the default world uses a plan and padded batches)."""


@pytest.mark.parametrize("digits", [3, 10])
def test_sampler_hits_every_carry_count(digits):
    rng = np.random.default_rng(0)
    for k in range(digits + 1):
        for _ in range(20):
            a, b = sample_pair(rng, digits, k)
            assert a < 10 ** digits and b < 10 ** digits and carries_of(a, b, digits) == k


def test_problem_format_is_least_significant_digit_first():
    p = make_problem(123, 989, 3, "x")
    assert p.question == "321+989" and p.answer == "2111" and p.meta["carries"] == 3  # 123+989=1112
    assert lsb(1112, 4) == "2111"


def test_families_are_disjoint_and_graded():
    wcfg = ArithWorldConfig()
    pool = family_problems(wcfg, wcfg.hard_carries, 300, 0, "pool")
    stepping = family_problems(wcfg, wcfg.stepping_carries, 256, 0, "stepping")
    control = family_problems(wcfg, wcfg.control_carries, 256, 0, "control")
    assert {p.meta["carries"] for p in pool} == set(wcfg.hard_carries)
    assert {p.meta["carries"] for p in stepping} == set(wcfg.stepping_carries)
    questions = [{p.question for p in fam} for fam in (pool, stepping, control)]
    assert not (questions[0] & questions[1]) and not (questions[0] & questions[2])
    assert len({p.id for p in pool + stepping + control}) == 812


def test_teacher_format_round_trips():
    p = make_problem(5, 7, 3, "x")
    assert parse_pair(format_pair(p.question, p.answer)) == Pair(p.question, p.answer)


@pytest.mark.parametrize("mode", ["plan", "worked", "both"])
def test_teacher_carries_mark_the_carries_and_parse_to_the_pair(mode):
    rng = np.random.default_rng(3)
    for k in (0, 4, 10):
        a, b = sample_pair(rng, 10, k)
        text, offset = teacher_completion(a, b, ArithWorldConfig(digits=10, teacher_carries=mode))
        p = make_problem(a, b, 10, "x")
        bits = "".join(str(int((a % 10 ** (i + 1)) + (b % 10 ** (i + 1)) >= 10 ** (i + 1))) for i in range(10))
        assert bits.count("1") == k
        plan = "carries " + bits
        # plan: before the question; worked: between the question and the answer; both
        assert text.startswith(plan) == (mode != "worked") and (f"</question>{plan}<answer>" in text) == (mode != "plan")
        assert parse_pair(text) == Pair(p.question, p.answer) and text[offset:offset + 11] == p.answer
        assert teacher_completion(a, b, ArithWorldConfig(digits=10, teacher_carries="none"))[0] == \
            format_pair(p.question, p.answer)


def test_inverse_teacher_writes_sum_and_addend_then_subtracts_and_copies():
    """``inverse``: before the question, ``s-a=b`` with s = a + b (least-significant digit first);
    the question and the boxed answer are copies of it, and the parser ignores it."""
    rng = np.random.default_rng(4)
    for k in (0, 5, 10):
        a, b = sample_pair(rng, 10, k)
        text, offset = teacher_completion(a, b, ArithWorldConfig(digits=10, teacher_carries="inverse"))
        p = make_problem(a, b, 10, "x")
        s_, rest = text.split("-", 1)
        a_, rest = rest.split("=", 1)
        b_ = rest.split("<question>", 1)[0]
        assert int(s_[::-1]) - int(a_[::-1]) == int(b_[::-1]) == b and int(a_[::-1]) == a
        assert (s_, f"{a_}+{b_}") == (p.answer, p.question)
        assert parse_pair(text) == Pair(p.question, p.answer) and text[offset:offset + 11] == p.answer


def test_unknown_teacher_carries_mode_is_a_config_error(tmp_path):
    from soar.config import ConfigError

    with pytest.raises(ConfigError, match="world.teacher_carries"):
        pretrain(ArithWorldConfig(digits=2, teacher_carries="after", out_dir=str(tmp_path / "w")), seed=0, progress=False)


def test_loss_backward_by_length_gives_the_padded_batch_gradient():
    """Pretraining runs one pass per sequence length; its loss and gradients must be the padded batch's."""
    import torch

    from soar.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=32, layers=2, heads=2, max_positions=64, seed=0)
    rng = np.random.default_rng(0)
    ids = [rng.integers(4, 90, size=n).tolist() for n in (9, 14, 9, 20, 14)]
    labels = [[-100] * 3 + seq[3:] for seq in ids]
    labels[1][5:8] = [-100] * 3  # a masked span inside a completion
    grouped_loss = sum(loss_backward(model, ids, labels))
    grouped = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    width = max(map(len, ids))
    x = torch.full((len(ids), width), tok.pad_token_id)
    y = torch.full((len(ids), width), -100)
    for i, (seq, lab) in enumerate(zip(ids, labels)):
        x[i, : len(seq)], y[i, : len(seq)] = torch.tensor(seq), torch.tensor(lab)
    padded_loss = model(input_ids=x, attention_mask=(x != tok.pad_token_id).long(), labels=y).loss
    padded_loss.backward()
    assert grouped_loss == pytest.approx(padded_loss.item(), rel=1e-5)
    for g, p in zip(grouped, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_pretraining_is_deterministic_and_cached(tmp_path):
    wcfg = dict(digits=2, hidden=32, layers=1, heads=2, max_steps=6, eval_every=3, eval_per_carry=4,
                batch_size=16, stop_acc=[[0, 2.0]], **PLAIN)
    a = pretrain(ArithWorldConfig(**wcfg, out_dir=str(tmp_path / "a")), seed=1, progress=False)
    b = pretrain(ArithWorldConfig(**wcfg, out_dir=str(tmp_path / "b")), seed=1, progress=False)
    digest = lambda d: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(a) == digest(b)
    info = json.loads((a / "train_info.json").read_text())
    assert info["seed"] == 1 and info["steps"] == 6 and "c0" in info["accuracy_by_carries"]
    assert (a / "README.md").exists() and (a / "tokenizer.json").exists()
    mtime = (a / "model.safetensors").stat().st_mtime
    assert pretrain(ArithWorldConfig(**wcfg, out_dir=str(tmp_path / "a")), seed=1, progress=False) == a
    assert (a / "model.safetensors").stat().st_mtime == mtime  # cached, not rebuilt
    assert world_hash(ArithWorldConfig(**wcfg), 1) != world_hash(ArithWorldConfig(**wcfg), 2)


def test_snapshots_and_padded_batches(tmp_path):
    """``snapshot_steps`` saves loadable worlds along the way without changing the final weights, a
    snapshot equals a build stopped at its step, and ``padded_batches`` trains to other weights of
    the same world (float rounding only)."""
    wcfg = dict(digits=2, hidden=32, layers=1, heads=2, eval_every=3, eval_per_carry=4, batch_size=16, stop_acc=[],
                **PLAIN)
    digest = lambda d: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    full = pretrain(ArithWorldConfig(**wcfg, max_steps=6, snapshot_steps=[4], out_dir=str(tmp_path / "a")), 1, False)
    plain = pretrain(ArithWorldConfig(**wcfg, max_steps=6, out_dir=str(tmp_path / "b")), 1, False)
    short = pretrain(ArithWorldConfig(**wcfg, max_steps=4, out_dir=str(tmp_path / "c")), 1, False)
    snap = full / "snapshots" / "step_4"
    assert digest(full) == digest(plain) and digest(snap) == digest(short) != digest(full)
    assert json.loads((snap / "train_info.json").read_text())["steps"] == 4
    assert json.loads((full / "train_info.json").read_text())["steps"] == 6  # stop_acc []: exactly max_steps
    assert pretrain(ArithWorldConfig(**wcfg, max_steps=6, out_dir=str(snap)), 1, False) == snap  # loads as a world
    padded = pretrain(ArithWorldConfig(**{**wcfg, "padded_batches": True}, max_steps=6, out_dir=str(tmp_path / "d")), 1,
                      False)
    assert digest(padded) != digest(plain)
    assert world_hash(ArithWorldConfig(**wcfg, snapshot_steps=[4]), 1) == world_hash(ArithWorldConfig(**wcfg), 1)


def test_default_world_ships_with_the_package(tmp_path, monkeypatch):
    """``experiment=arith``'s world model is in the package under its config hash; ``model.build``
    loads it when the cache has no copy, and it is the pretrained world (not a random init):
    carry-free sums are solved greedily, 12-carry sums are not."""
    from soar.models import load_model, load_tokenizer
    from soar.worlds.arith import generate_problems, shipped_dir
    from soar.worlds.base import build_model_hook, get_world

    monkeypatch.setenv("HOME", str(tmp_path))  # an empty cache
    cfg = soar.compose(["experiment=arith"])
    wcfg = get_world("arith").config(cfg)
    shipped = shipped_dir(wcfg, wcfg.seed)
    assert shipped is not None and build_model_hook(cfg) == shipped
    info = json.loads((shipped / "train_info.json").read_text())
    assert info["config"]["teacher_carries"] == wcfg.teacher_carries and info["steps"] == wcfg.max_steps
    assert shipped_dir(get_world("arith").config(soar.compose(["experiment=arith", "world.seed=1"])), 1) is None
    mcfg = type("M", (), {"path": str(shipped), "revision": None, "dtype": "float32", "trust_remote_code": False})
    from soar.worlds.arith_pretrain import accuracy

    model, tok = load_model(mcfg), load_tokenizer(mcfg)
    assert accuracy(model, tok, generate_problems(12, 0, 32, 5, "t"), wcfg.student_template) >= 0.9
    assert accuracy(model, tok, generate_problems(12, 12, 32, 5, "t"), wcfg.student_template) == 0


def test_world_problems_cli(tmp_path):
    res = run_cli([script("soar-world"), "problems", f"run.dir={tmp_path}", "world.pool_size=30", "world.family_size=8"])
    paths = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(paths) == {"pool", "stepping", "control"}
    assert len((tmp_path / "pool.jsonl").read_text().splitlines()) == 30
    bad = run_cli([script("soar-world"), "train"], check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_world_registry_and_hooks(tmp_path):
    """``world=<name>`` resolves through the registry; the hooks ``model.build``, ``data.build`` and
    ``loop.answer_oracle`` set to ``world`` reach the configured world's methods, and a dotted path
    loads a function of the user's; a second world is one subclass (here registered in the test)."""
    from dataclasses import dataclass

    from omegaconf import OmegaConf, open_dict

    from soar.config import ConfigError
    from soar.data import Problem, load_problem_records
    from soar.worlds.arith import ArithWorld, family_problems, oracle_answer
    from soar.worlds.base import (
        WORLDS,
        World,
        answer_oracle_hook,
        build_pool_hook,
        configured_world,
        get_world,
        register_world,
    )

    assert isinstance(get_world("arith"), ArithWorld)
    with pytest.raises(ConfigError, match="unknown world 'nope'"):
        get_world("nope")
    cfg = soar.compose(["experiment=arith_micro"])
    assert cfg.world.name == "arith" and cfg.model.build == cfg.data.build == cfg.loop.answer_oracle == "world"
    # 321 + 654 = 975, every number least-significant digit first
    assert answer_oracle_hook(cfg)("123+456") == oracle_answer("123+456") == "5790"
    pool = build_pool_hook(cfg, tmp_path / "problems")
    wcfg = configured_world(cfg).config(cfg)
    assert pool == tmp_path / "problems" / "pool.jsonl"
    assert [p.question for p in load_problem_records(cfg.data, pool)] == \
        [p.question for p in family_problems(wcfg, wcfg.hard_carries, wcfg.pool_size, wcfg.seed, "pool")]
    assert configured_world(cfg).oracle_problems(cfg, 4) == family_problems(wcfg, wcfg.stepping_carries, 4, wcfg.seed,
                                                                            "oracle")
    with open_dict(cfg):
        cfg.loop.answer_oracle = "soar.worlds.arith:oracle_answer"  # a user's function, by its dotted path
    assert answer_oracle_hook(cfg) is oracle_answer
    with open_dict(cfg):
        cfg.loop.answer_oracle = None
    assert answer_oracle_hook(cfg) is None

    @dataclass
    class EchoConfig:
        name: str = "echo"
        size: int = 3

    @register_world
    class EchoWorld(World):
        name, config_class = "echo", EchoConfig

        def oracle_problems(self, cfg, count):
            return [Problem(f"oracle/{i}", f"{i}+{i}", str(2 * i)) for i in range(min(count, self.config(cfg).size))]

        def answer_oracle(self, cfg, question):
            return "echo"

    try:
        echo = OmegaConf.create(OmegaConf.to_container(cfg))
        echo.world, echo.loop.answer_oracle = {"name": "echo", "size": 2}, "world"
        assert answer_oracle_hook(echo)("anything") == "echo"
        assert [p.id for p in configured_world(echo).oracle_problems(echo, 5)] == ["oracle/0", "oracle/1"]
        assert get_world("echo").config(echo).size == 2
    finally:
        WORLDS.pop("echo")


def test_every_world_method_has_a_caller():
    """The World interface holds only what the stages call (issue 51: three of its ten methods had no
    caller): each method a world implements is called in the package outside the world modules (the
    stages, or the hooks of ``soar.worlds.base`` they call); ``config`` is the base class's helper for them."""
    from soar.worlds.base import World

    package = Path(soar.__file__).parent
    code = "\n".join(p.read_text() for p in package.rglob("*.py")
                     if p.parent.name != "worlds" or p.name == "base.py")
    methods = [name for name, value in vars(World).items() if callable(value) and not name.startswith("_")]
    assert sorted(methods) == ["answer_oracle", "build_model", "build_pool", "config", "oracle_problems", "pretrain",
                               "problem_files"]
    assert [m for m in methods if m != "config" and f".{m}(cfg" not in code and f".{m}(self.cfg" not in code] == []


ECHO_WORLD = Path(__file__).resolve().parent / "worlds"
"""A world outside the package: ``echo_world.py`` and ``echo.yaml``, nothing else."""


def echo_installed(tmp_path: Path) -> dict:
    """The environment of a machine where the echo world is installed as a package of its own: its folder on the
    path and a ``dist-info`` with its entry point (group ``soar.worlds``), as ``pip install`` writes them."""
    site = tmp_path / "site"
    info = site / "echo_world-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-world\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[soar.worlds]\necho = echo_world\n")
    path = [str(site), str(ECHO_WORLD), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


ECHO_STEP = """
import json, sys
import soar
from soar.data import load_problems, render_prompt
from soar.grading import make_grader
from soar.worlds.base import answer_oracle_hook, build_pool_hook
cfg = soar.compose(["world=echo", "model.path=unused", *sys.argv[2:]])
pool = load_problems(cfg.data, str(build_pool_hook(cfg, sys.argv[1])))
grader, oracle = make_grader(cfg.data.grader), answer_oracle_hook(cfg)
print(json.dumps({
    "world": dict(cfg.world), "model_max_context": cfg.model.max_context, "data_build": cfg.data.build,
    "grader": cfg.data.grader, "prompt": render_prompt(cfg.data.prompt_template, pool[0].question),
    "problems": [[p.question, p.answer] for p in pool],
    "right": [grader.correct("\\\\boxed{" + p.question + "}", p.answer) for p in pool],
    "wrong": [grader.correct("\\\\boxed{" + str(int(p.question) + 1) + "}", p.answer) for p in pool],
    "oracle": [oracle(p.question) == p.answer for p in pool] + [oracle("12ab") is None],
    "oracle_problems": [p.id for p in soar.worlds.base.configured_world(cfg).oracle_problems(cfg, 3)]}))
"""


def test_a_new_world_is_one_module_and_one_yaml(tmp_path):
    """A world outside the package (``tests/worlds``: ``echo_world.py`` + ``echo.yaml``), named by an entry point,
    composes with ``world=echo``: its YAML sets the world's fields over its dataclass and the model and data
    defaults it brings, the command line still wins, and the steps that need no training run: its hard-set pool,
    the data config's prompt and grader on it, its oracle, and ``soar-world problems``."""
    with pytest.raises(Exception, match="echo"):  # not installed: no such world
        soar.compose(["world=echo"])
    env = echo_installed(tmp_path)
    res = subprocess.run([sys.executable, "-c", ECHO_STEP, str(tmp_path / "pool"), "world.pool_size=6"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    template = "Repeat {question}: "
    assert out["world"] == {"name": "echo", "seed": 0, "digits": 5, "pool_size": 6, "student_template": template}
    assert (out["model_max_context"], out["data_build"], out["grader"]) == (64, "world", "integer")
    assert len(out["problems"]) == 6 and all(q == a and len(q) == 5 and q.isdigit() for q, a in out["problems"])
    assert out["prompt"] == f"Repeat {out['problems'][0][0]}: "
    assert all(out["right"]) and not any(out["wrong"]) and all(out["oracle"])
    assert out["oracle_problems"] == ["oracle/0", "oracle/1", "oracle/2"]
    cli = subprocess.run([script("soar-world"), "problems", "world=echo", f"run.dir={tmp_path / 'cli'}"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert json.loads(cli.stdout.strip().splitlines()[-1]) == {"pool": str(tmp_path / "cli" / "pool.jsonl")}
    assert len((tmp_path / "cli" / "pool.jsonl").read_text().splitlines()) == 16
