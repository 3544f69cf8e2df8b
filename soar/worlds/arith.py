"""The embedded arithmetic world: carry-count addition and a character-level Llama pretrained here.

    soar-world pretrain                         # build (or reuse) the default world model
    soar-world pretrain world.digits=3 world.max_steps=200 world.out_dir=/tmp/tiny

This module is the world's domain (settings, problems, exact answers, its coach's carry plan) and imports
no torch, so composing a config stays light; its model's pretraining is ``soar.worlds.arith_pretrain``,
imported when a model is built.

Problems add two ``digits``-long numbers, zero-padded and written least-significant digit first
(carries then propagate left to right, in generation order); the answer is the ``digits+1``-digit
sum, also least-significant first, in ``\\boxed{}``. Difficulty = the number of carry positions.
Because answers are fixed-width digit strings graded by the ``integer`` grader, an answer that
drops a leading 0 would also count; the model never emits such strings in practice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from soar.data import Problem, write_jsonl
from soar.seeding import derive_seed
from soar.worlds.base import World, register_world

log = logging.getLogger("soar.world")


@dataclass
class ArithWorldConfig:
    """Settings of the embedded arithmetic world (``cfg.world``; ``conf/world/arith.yaml`` adds nothing,
    so these defaults are the world's only ones: the shipped world model, ``shipped/arith-<hash>``).

    The student role is pretrained on sums with 0-2 carries. The teacher role (40 % of examples)
    writes questions of 0-8 carries after a carry plan (``carries 0110...``, outside the tags, so
    students never see it) and learns its answers at every carry count from that plan, a route the
    student's format never has. Trained for exactly 650 steps with batches padded to their longest
    sequence: the frontier then sits where 7-8-carry stepping stones unlock 12-carry sums (measured:
    +0.29 on hard train after 8 RLOO steps, 0 for carry-free controls, +0.06 for the hard set
    itself), the base student fails 288 of 300 12-carry sums 0/128, and the base teacher is right on
    63 % of its pairs (docs/world.md). ``soar-world pretrain`` rebuilds it (~8 minutes on 2 cores) and
    ``dev/scripts/rebuild_world.py`` checks the rebuild against the shipped copy."""

    name: str = "arith"
    """The world (``world=arith``); not part of the model's cache key."""
    seed: int = 0
    """World seed (model init, pretraining data, problem files); separate from the run seed so
    runs with different seeds share one world model and hard-set pool."""
    pool_seed: Optional[int] = None
    """Seed of the problem files alone (the hard-set pool, the stepping-stone and control families);
    None: ``seed``. A study that wants an independent pool per run seed sets ``${seed}`` (the world
    model stays the same)."""
    digits: int = 12
    """Operand length in digits (zero-padded)."""
    student_template: str = "<question>{question}</question><answer>"
    """Student prompt (``data=arith`` reads it from here). It ends like the teacher's question, so
    the answer sits at the same offsets in both roles and the base teacher can compute answers."""
    teacher_prompt: str = "Write a new addition problem and its answer.\n"
    """Teacher prompt; completions are ``<question>a+b</question><answer>\\boxed{sum}</answer>``."""
    pretrain_carry_weights: list[float] = field(default_factory=lambda: [0.7, 0.2, 0.1])
    """Pretraining mix over carry counts 0, 1, 2, ...; harder problems are never shown."""
    teacher_frac: float = 0.4
    """Share of pretraining examples in the teacher format (``teacher_prompt`` ->
    ``<question>a+b</question><answer>\\boxed{sum}</answer>``), questions from the same carry mix,
    so the base model can act as an (untrained) teacher."""
    teacher_carry_weights: list[float] | None = field(default_factory=lambda: [1.0] * 9)
    """Carry mix of the teacher-format questions (None: ``pretrain_carry_weights``). A wider mix
    lets the untrained teacher propose harder questions than the student was shown."""
    teacher_answer_max_carries: int | None = None
    """Teacher-format answers are learned (loss on their digits) only up to this carry count (None:
    always), so a wide teacher mix does not teach the student role to carry further."""
    teacher_carries: str = "plan"
    """Carry bits (``carries 0110...``: one per position, least-significant first, 1 where the sum
    carries) in the teacher's completion, outside the tags, so students never see them: ``none``;
    ``plan``: before the question, as the world's own sampler picks carries before digits; ``worked``:
    worked out from the question, between it and the answer (a scratchpad); ``both``; ``inverse``: no bits,
    but the sum and one addend first and the other addend worked out by subtraction (``s-a=b``), so the
    question and its answer are copies: the teacher constructs a problem from its answer, by an operation
    the student's format never uses. Experiments for teacher
    answers learned at every carry count (``teacher_answer_max_carries: null``); measured in docs/world.md,
    "The embedded world". Adds ``digits + 8`` tokens each: raise ``teacher.max_tokens`` (112 for 12 digits,
    132 for ``both``)."""
    hard_carries: list[int] = field(default_factory=lambda: [12])
    """Carry counts of the hard-set candidates (H), filtered with fail@k."""
    stepping_carries: list[int] = field(default_factory=lambda: [7, 8])
    """Stepping-stone family (S): solved sometimes; training on it should move H."""
    control_carries: list[int] = field(default_factory=lambda: [0])
    """Control family (C): already solved; training on it should not move H."""
    pool_size: int = 300
    """Hard-set candidates written by ``soar-world problems`` (before fail@k)."""
    family_size: int = 256
    """Problems per stepping-stone / control file."""
    hidden: int = 128
    """Model width."""
    layers: int = 4
    """Transformer layers."""
    heads: int = 4
    """Attention heads."""
    max_positions: int = 2048
    """Model context (positions); sized for the longest template plus generation budgets."""
    lr: float = 1e-3
    """Pretraining AdamW peak learning rate."""
    warmup_steps: int = 30
    """Linear learning-rate warm-up (without it, lr 1e-3 spikes and collapses the model)."""
    grad_clip: float = 1.0
    """Gradient-norm clipping for pretraining stability."""
    batch_size: int = 128
    """Pretraining sequences per step."""
    max_steps: int = 650
    """Upper bound on pretraining steps."""
    eval_every: int = 25
    """Evaluation period (steps) for the stopping rule."""
    eval_per_carry: int = 64
    """Problems per carry count in each evaluation."""
    stop_acc: list = field(default_factory=list)
    """``[[carries, threshold], ...]``: stop at the first evaluation where accuracy at each listed
    carry count reaches its threshold ("stopped at the frontier": trained much longer, the model
    generalises every carry count). A list, so an override replaces it instead of merging; ``[]``
    trains exactly ``max_steps`` steps."""
    stop_temperature: float = 1.0
    """Temperature of the stopping rule's accuracy (0: greedy; 1.0: the students' sampling
    temperature, mean over ``stop_samples`` samples)."""
    stop_samples: int = 4
    """Samples per problem when ``stop_temperature`` > 0."""
    padded_batches: bool = True
    """Pretrain with one forward pass per batch padded to its longest sequence (the first recipe)
    instead of one pass per sequence length: the same gradients up to float rounding, so another
    draw of the same world, 1.3x slower."""
    threads: int = 0
    """torch threads for pretraining (0: all cores)."""
    out_dir: str | None = None
    """Where to save; None caches under ``~/.cache/soar/worlds/<config hash>``."""
    snapshot_steps: list[int] = field(default_factory=list)
    """Also save the model after these steps, under ``<out>/snapshots/step_N`` (HF format), to measure
    how the frontier moves during pretraining (``dev/scripts/frontier.py`` on each snapshot)."""

def carry_bits(a: int, b: int, digits: int) -> list[int]:
    """1 at each position (least-significant first) where ``a + b`` carries."""
    bits, carry = [], 0
    for i in range(digits):
        carry = int((a // 10 ** i) % 10 + (b // 10 ** i) % 10 + carry >= 10)
        bits.append(carry)
    return bits


def carries_of(a: int, b: int, digits: int) -> int:
    return sum(carry_bits(a, b, digits))


def sample_pair(rng: np.random.Generator, digits: int, carries: int) -> tuple[int, int]:
    """Two numbers whose sum carries at exactly ``carries`` positions (chosen uniformly)."""
    positions = set(rng.choice(digits, size=carries, replace=False).tolist())
    a = b = 0
    carry_in = 0
    for i in range(digits):
        want = i in positions
        while True:  # rejection: few draws are needed per digit
            x, y = int(rng.integers(10)), int(rng.integers(10))
            if (x + y + carry_in >= 10) == want:
                break
        a += x * 10 ** i
        b += y * 10 ** i
        carry_in = int(want)
    return a, b


def lsb(n: int, width: int) -> str:
    return str(n).zfill(width)[::-1]


def make_problem(a: int, b: int, digits: int, pid: str) -> Problem:
    return Problem(id=pid, question=f"{lsb(a, digits)}+{lsb(b, digits)}", answer=lsb(a + b, digits + 1),
                   source="arith", meta={"carries": carries_of(a, b, digits)})


def generate_problems(digits: int, carries: int, count: int, seed: int, prefix: str) -> list[Problem]:
    rng = np.random.default_rng(seed)
    return [make_problem(*sample_pair(rng, digits, carries), digits, f"{prefix}/c{carries}/{i}") for i in range(count)]


def completion_text(answer: str) -> str:
    return f"\\boxed{{{answer}}}"


def carry_plan(a: int, b: int, digits: int) -> str:
    return plan_text(carry_bits(a, b, digits))


def plan_text(bits: list[int]) -> str:
    """Carry bits as the teacher role writes them: ``carries 0110...``, least significant first."""
    return "carries " + "".join(map(str, bits))


def inverse_plan(a: int, b: int, digits: int) -> str:
    """The inverse route: the sum and one addend first, then the other addend by subtraction
    (``s-a=b``, all least-significant digit first)."""
    return f"{lsb(a + b, digits + 1)}-{lsb(a, digits)}={lsb(b, digits)}"


TEACHER_CARRIES = ("none", "plan", "worked", "both", "inverse")


def route_text(a: int, b: int, digits: int, mode: str) -> str | None:
    """What a ``mode`` teacher writes outside the tags that fixes its answer (carry bits, or the
    inverse route's subtraction), to check a sampled completion against; None for ``none``."""
    if mode == "none":
        return None
    return inverse_plan(a, b, digits) if mode == "inverse" else carry_plan(a, b, digits)


MODEL_INDEPENDENT = ("name", "out_dir", "threads", "snapshot_steps", "pool_seed", "hard_carries", "stepping_carries",
                     "control_carries", "pool_size", "family_size")

RECIPE = 2
"""Version of the pretraining procedure, part of the cache key: bump it when a code change alters
the weights a config trains to (2: one forward pass per sequence length, no padding)."""


def world_hash(wcfg: ArithWorldConfig, seed: int) -> str:
    payload = {k: v for k, v in asdict(wcfg).items() if k not in MODEL_INDEPENDENT + ("seed",)}
    payload["recipe"] = RECIPE
    return hashlib.sha256(json.dumps({"seed": seed, **payload}, sort_keys=True, default=str).encode()).hexdigest()[:12]


SHIPPED = Path(__file__).resolve().parent / "shipped"
"""Pretrained world models that ship in the package (``shipped/arith-<hash>/``: weights, tokenizer,
model card, ``train_info.json``), so ``model.build`` need not pretrain; ``soar-world pretrain``
rebuilds any of them bit for bit on the same kind of machine (``dev/scripts/rebuild_world.py`` checks)."""


def world_dir(wcfg: ArithWorldConfig, seed: int) -> Path:
    if wcfg.out_dir:
        return Path(wcfg.out_dir).expanduser()
    return Path("~/.cache/soar/worlds").expanduser() / f"arith-{world_hash(wcfg, seed)}"


def shipped_dir(wcfg: ArithWorldConfig, seed: int) -> Path | None:
    """The packaged copy of this exact world (same config hash), if the package ships one."""
    path = SHIPPED / f"arith-{world_hash(wcfg, seed)}"
    return path if (path / "train_info.json").exists() else None


def family_problems(wcfg: ArithWorldConfig, carries: list[int], count: int, seed: int, name: str) -> list[Problem]:
    """``count`` problems spread evenly over ``carries``, ids ``<name>/c<k>/<i>``."""
    per = [count // len(carries) + (i < count % len(carries)) for i in range(len(carries))]
    return [p for c, n in zip(carries, per) for p in generate_problems(wcfg.digits, c, n, derive(seed, name, c), name)]


def derive(seed: int, *parts) -> int:
    return derive_seed(seed, "arith", *parts)


def problem_seed(wcfg: ArithWorldConfig) -> int:
    """The seed of the problem files: ``pool_seed``, else the world's ``seed``."""
    return wcfg.seed if wcfg.pool_seed is None else wcfg.pool_seed


def write_families(wcfg: ArithWorldConfig, seed: int, out: Path) -> dict[str, Path]:
    """Write the hard-set pool and the S / C families as JSONL (ids never collide: one prefix each)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    families = {"pool": family_problems(wcfg, wcfg.hard_carries, wcfg.pool_size, seed, "pool"),
                "stepping": family_problems(wcfg, wcfg.stepping_carries, wcfg.family_size, seed, "stepping"),
                "control": family_problems(wcfg, wcfg.control_carries, wcfg.family_size, seed, "control")}
    paths = {}
    for name, probs in families.items():
        paths[name] = out / f"{name}.jsonl"
        write_jsonl(paths[name], [p.to_dict() for p in probs])
    return paths


def parse_question(question: str) -> tuple[int, int, int] | None:
    """``(a, b, digits)`` of a world question (two equal-length least-significant-first numbers)."""
    m = re.fullmatch(r"(\d+)\+(\d+)", question)
    if m is None or len(m.group(1)) != len(m.group(2)):
        return None
    return int(m.group(1)[::-1]), int(m.group(2)[::-1]), len(m.group(1))


def oracle_answer(question: str) -> str | None:
    """The exact answer to a world question (``loop.answer_oracle``); None if it is not one."""
    parsed = parse_question(question)
    return None if parsed is None else lsb(parsed[0] + parsed[1], parsed[2] + 1)


def carry_advice(question: str, noise: float = 0.0, rng: np.random.Generator | None = None) -> str | None:
    """The world's programmatic coach, a stand-in for an LLM coach that reads the problem: ``question``'s
    carry positions computed from its two addends alone (no reference answer), written as the teacher
    role's carry plan (``carries 0110...``, least significant first), each bit flipped with probability
    ``noise`` (draws from ``rng``); None unless the question is one of the world's. On sums whose carries
    differ the advice differs per problem; with the plan the teacher role was pretrained to read, it is
    close to answer-equivalent, which is why it is a stand-in (docs/distill.md)."""
    parsed = parse_question(question)
    if parsed is None:
        return None
    bits = carry_bits(*parsed)
    if noise > 0:
        flips = rng.random(len(bits)) < noise
        bits = [b ^ int(f) for b, f in zip(bits, flips)]
    return plan_text(bits)


@register_world
class ArithWorld(World):
    """Carry-count addition (``ArithWorldConfig``): the hard-set candidates (``hard_carries``), the
    stepping stones (``stepping_carries``: the oracle's questions) and a control family (already solved)."""

    name = "arith"
    config_class = ArithWorldConfig

    def build_model(self, cfg) -> Path:
        """The world model the package ships for this config (the same weights on every machine), else
        the one built for it (``world.out_dir``, or the cache), else pretrain it there."""
        wcfg = self.config(cfg)
        shipped = None if wcfg.out_dir else shipped_dir(wcfg, wcfg.seed)
        if shipped is not None:
            log.info("world model shipped with the package: %s", shipped)
            return shipped
        return self.pretrain(cfg)

    def pretrain(self, cfg) -> Path:
        """Pretrain the world model into the cache or ``world.out_dir`` (or reuse its own build there), even
        when the package ships it; never into a folder of other files."""
        from soar.worlds.arith_pretrain import pretrain  # torch: imported only when a model is built

        wcfg = self.config(cfg)
        return pretrain(wcfg, wcfg.seed, progress=cfg.run.progress)

    def build_pool(self, cfg, out_dir: Path) -> Path:
        """The hard-set candidates, written with the stepping-stone and control families."""
        return self.problem_files(cfg, out_dir)["pool"]

    def problem_files(self, cfg, out_dir: Path) -> dict[str, Path]:
        """The pool and the stepping-stone / control families (``write_families``)."""
        wcfg = self.config(cfg)
        return write_families(wcfg, problem_seed(wcfg), out_dir)

    def oracle_problems(self, cfg, count: int) -> list[Problem]:
        """Stepping stones (ids ``oracle/...``): solved sometimes, and training on them moves the hard set."""
        wcfg = self.config(cfg)
        return family_problems(wcfg, wcfg.stepping_carries, count, wcfg.seed, "oracle")

    def answer_oracle(self, cfg, question: str) -> str | None:
        return oracle_answer(question)
