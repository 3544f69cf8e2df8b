"""The embedded world with roles that can fail (issue 60 §2): the arithmetic world's sums (``soar.worlds.arith``:
least-significant digit first, zero-padded, difficulty = carries) played by a team, for ``soar-team``.

One character-level Llama is pretrained on every role's format, on sums of at most a frontier of carries
(``carry_weights``), so each role errs beyond it:

- **solver** ``<question>q</question><solve>`` -> a working: ``carries 0110 \\boxed{52710}`` (the carry out of
  each position, then the sum);
- **coach** ``<question>q</question><attempt>w</attempt><critique>`` -> ``ok`` or ``pos i``, the first position
  (least significant first) whose carry or sum digit is wrong, without the reference: it must redo the sum;
- **reviser** ``...<critique>c</critique><revise>`` -> the corrected working (``c`` may be ``?``: no critique);
- **planner** ``<question>q</question><plan>`` -> ``carries 0110``;
- **adder**, the ``digit_add`` tool (no weights): each sum digit from the plan's carries, and a flag where the
  plan's carry disagrees with the digits: ``sum 52710 flags 0010``;
- **verifier** ``<question>q</question><plan>p</plan><tool>t</tool><verify>`` -> ``\\boxed{52710}``.

Coach and reviser inputs in pretraining are the right working or one with a wrong carry (the digits after it
follow the wrong carry) or a wrong digit; critiques are always true.

This module is the world's domain (settings, formats, problems, exact answers) and imports no torch and no
team code, so composing a config stays light. The team's parsers, tools and stand-in coach for these formats
are ``soar.worlds.arith_team_formats`` (registered when ``soar-team`` checks a team); the model's pretraining
is ``soar.worlds.arith_team_pretrain``, imported when a model is built.

    soar-world pretrain world=arith_team                       # the team world model (heavy: docs/team.md)
    soar-team experiment=team_scr_arith_micro                   # recipe A in the micro world
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from soar.data import write_jsonl
from soar.seeding import derive_seed
from soar.worlds.arith import carry_bits, generate_problems, lsb, oracle_answer, parse_question
from soar.worlds.base import World, register_world

ROLES = ("solver", "coach", "reviser", "planner", "verifier")
"""The role formats the team world model is pretrained on."""
NO_CRITIQUE = "?"
"""The reviser's critique when it has none (``team.no_critique_text``)."""


@dataclass
class ArithTeamWorldConfig:
    """Settings of the team world (``world=arith_team``; ``conf/world/arith_team.yaml`` adds nothing, so these
    defaults are its only ones). The model is not shipped: ``soar-world pretrain world=arith_team`` builds it
    (docs/team.md gives the time); ``experiment=team_*_arith_micro`` builds a 3-digit one in about a minute."""

    name: str = "arith_team"
    """The world (``world=arith_team``); not part of the model's cache key."""
    seed: int = 0
    """World seed (model init, pretraining data, problem files)."""
    digits: int = 6
    """Operand length in digits."""
    student_template: str = "<question>{question}</question><solve>"
    """The solver's prompt (``data=arith`` reads ``data.prompt_template`` from it)."""
    coach_template: str = "<question>{question}</question><attempt>{solver}</attempt><critique>"
    """The coach's prompt: the attempt, no reference."""
    reviser_template: str = ("<question>{question}</question><attempt>{solver}</attempt><critique>{coach}</critique>"
                             "<revise>")
    """The reviser's prompt."""
    planner_template: str = "<question>{question}</question><plan>"
    """The planner's prompt."""
    verifier_template: str = "<question>{question}</question><plan>{planner}</plan><tool>{adder}</tool><verify>"
    """The verifier's prompt: the plan and the digit-add tool's output."""
    carry_weights: list[float] = field(default_factory=lambda: [0.4, 0.3, 0.2, 0.1])
    """Pretraining mix over carry counts 0, 1, 2, ... of every role's sums: the frontier (more are never shown)."""
    role_weights: dict[str, float] = field(default_factory=lambda: {r: 1.0 for r in ROLES})
    """Share of each role's format in pretraining."""
    attempt_mix: list[float] = field(default_factory=lambda: [0.4, 0.4, 0.2])
    """Coach and reviser inputs: right working, a wrong carry, a wrong digit."""
    no_critique_frac: float = 0.25
    """Share of reviser examples whose critique is ``?`` (a second attempt without a coach)."""
    plan_mix: list[float] = field(default_factory=lambda: [0.5, 0.4, 0.1])
    """Verifier inputs: the right plan, a plan with one carry flipped, a malformed plan (the tool says ``error``)."""
    team_carries: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 6])
    """Carry counts of the team's training and held-out problems (at and beyond the frontier)."""
    train_size: int = 500
    """Training problems (``data.build: world``)."""
    heldout_size: int = 200
    """Held-out problems (evaluation)."""
    hidden: int = 128
    """Model width."""
    layers: int = 4
    """Transformer layers."""
    heads: int = 4
    """Attention heads."""
    max_positions: int = 256
    """Model context (positions): the reviser's prompt and its working fit."""
    lr: float = 1e-3
    """Pretraining AdamW peak learning rate."""
    warmup_steps: int = 30
    """Linear learning-rate warm-up."""
    grad_clip: float = 1.0
    """Gradient-norm clipping."""
    batch_size: int = 128
    """Pretraining sequences per step."""
    max_steps: int = 2000
    """Pretraining steps."""
    profile_per_carry: int = 32
    """Problems per carry count and role in the saved accuracy profile (``train_info.json``)."""
    threads: int = 0
    """torch threads for pretraining (0: all cores)."""
    out_dir: str | None = None
    """Where to save; None caches under ``~/.cache/soar/worlds/arith_team-<config hash>``."""


# ---- the formats -----------------------------------------------------------------------------------------
def digits_of(n: int, width: int) -> list[int]:
    return [int(c) for c in lsb(n, width)]


def working(carries: list[int], sum_digits: list[int]) -> str:
    return f"carries {''.join(map(str, carries))} \\boxed{{{''.join(map(str, sum_digits))}}}"


def true_working(a: int, b: int, d: int) -> tuple[list[int], list[int]]:
    return carry_bits(a, b, d), digits_of(a + b, d + 1)


def digits_from_carries(a: int, b: int, d: int, carries: list[int]) -> list[int]:
    """Each sum digit as the carries say: (a_i + b_i + carry into i) mod 10, then the last carry."""
    ad, bd = digits_of(a, d), digits_of(b, d)
    return [(ad[i] + bd[i] + (carries[i - 1] if i else 0)) % 10 for i in range(d)] + [carries[d - 1]]


def corrupt(a: int, b: int, d: int, kind: int, rng: np.random.Generator) -> tuple[list[int], list[int], int | None]:
    """A working of ``a + b``: ``kind`` 0 right, 1 one carry flipped (the digits follow it), 2 one digit wrong;
    with the first wrong position (None: right)."""
    carries, sums = true_working(a, b, d)
    if kind == 0:
        return carries, sums, None
    if kind == 1:
        j = int(rng.integers(d))
        carries = list(carries)
        carries[j] = 1 - carries[j]
        return carries, digits_from_carries(a, b, d, carries), j
    j = int(rng.integers(d + 1))
    sums = list(sums)
    sums[j] = (sums[j] + int(rng.integers(1, 10))) % 10
    return carries, sums, j


WORKING = re.compile(r"carries ([01]+) \\boxed\{(\d+)\}")


def parse_working(text: str) -> tuple[list[int], list[int]] | None:
    m = WORKING.fullmatch((text or "").strip())
    return None if m is None else ([int(c) for c in m.group(1)], [int(c) for c in m.group(2)])


def first_wrong(question: str, attempt: str) -> int | None:
    """The first position (least significant first) whose carry or sum digit is wrong; 0 for a malformed
    working; None when it is right (or the question is not one of the world's)."""
    parsed_q = parse_question(question)
    if parsed_q is None:
        return None
    a, b, d = parsed_q
    carries, sums = true_working(a, b, d)
    got = parse_working(attempt)
    if got is None or len(got[0]) != d or len(got[1]) != d + 1:
        return 0
    for i in range(d + 1):
        if (i < d and got[0][i] != carries[i]) or got[1][i] != sums[i]:
            return i
    return None


def critique(question: str, attempt: str) -> str:
    pos = first_wrong(question, attempt)
    return "ok" if pos is None else f"pos {pos}"


# ---- problems and the model's cache key -------------------------------------------------------------------
def team_problems(wcfg: ArithTeamWorldConfig, count: int, seed: int, prefix: str):
    per = [count // len(wcfg.team_carries) + (i < count % len(wcfg.team_carries)) for i in range(len(wcfg.team_carries))]
    return [p for c, n in zip(wcfg.team_carries, per)
            for p in generate_problems(wcfg.digits, c, n, derive_seed(seed, "arith_team", prefix, c), prefix)]


MODEL_INDEPENDENT = ("name", "out_dir", "threads", "team_carries", "train_size", "heldout_size", "profile_per_carry")
RECIPE = 1
"""Version of the pretraining procedure (part of the cache key)."""


def world_dir(wcfg: ArithTeamWorldConfig) -> Path:
    if wcfg.out_dir:
        return Path(wcfg.out_dir).expanduser()
    payload = {k: v for k, v in asdict(wcfg).items() if k not in MODEL_INDEPENDENT}
    digest = hashlib.sha256(json.dumps({**payload, "recipe": RECIPE}, sort_keys=True, default=str).encode()).hexdigest()
    return Path("~/.cache/soar/worlds").expanduser() / f"arith_team-{digest[:12]}"


@register_world
class ArithTeamWorld(World):
    """The embedded world for teams (``ArithTeamWorldConfig``): its model, its problems (``build_pool`` writes the
    training file and ``heldout.jsonl`` beside it), the exact answers."""

    name = "arith_team"
    config_class = ArithTeamWorldConfig

    def build_model(self, cfg) -> Path:
        """The team world model built for this config (cached; never shipped): pretrained on first use."""
        from soar.worlds.arith_team_pretrain import pretrain  # torch: imported only when a model is built

        return pretrain(self.config(cfg), progress=cfg.run.progress)

    def build_pool(self, cfg, out_dir: Path) -> Path:
        wcfg = self.config(cfg)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, size in (("heldout", wcfg.heldout_size), ("train", wcfg.train_size)):
            write_jsonl(out / f"{name}.jsonl", [p.to_dict() for p in team_problems(wcfg, size, wcfg.seed, name)])
        return out / "train.jsonl"

    def answer_oracle(self, cfg, question: str) -> str | None:
        return oracle_answer(question)
