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
follow the wrong carry) or a wrong digit; critiques are always true. Also registered here: the parsers
``arith_working``, ``arith_critique``, ``arith_plan``; the tools ``digit_add`` and ``arith_oracle_critique``
(reads the reference: an upper bound only); and ``arith_stand_in``, a programmatic process coach of
controlled quality (a stand-in for an LLM coach: it scores from the true sum, with ``team.scorer.noise``
and ``bias``).

    soar-world pretrain world=arith_team                       # the team world model (heavy: docs/team.md)
    soar-team experiment=team_scr_arith_micro                   # recipe A in the micro world
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from soar.config import ConfigError
from soar.data import write_jsonl
from soar.generation import HFGenerator
from soar.models import build_char_tokenizer, build_tiny_llama, set_threads
from soar.samples import SamplingParams
from soar.seeding import derive_seed
from soar.team.formats import (
    Parsed,
    ScoreCall,
    ToolCall,
    register_error_type,
    register_parser,
    register_scorer,
    register_tool,
)
from soar.worlds.arith import carry_bits, generate_problems, lsb, padded_loss_backward, parse_question, sample_pair
from soar.worlds.base import World, register_world

log = logging.getLogger("soar.world")

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


@register_error_type("arith_working")
def error_type(question: str, attempt: str) -> str:
    """What is wrong with a working: ``none``, ``format``, ``carry`` (a carry bit is) or ``digit`` (only digits)."""
    parsed_q = parse_question(question)
    got = parse_working(attempt)
    if parsed_q is None:
        return "unknown"
    a, b, d = parsed_q
    if got is None or len(got[0]) != d or len(got[1]) != d + 1:
        return "format"
    carries, sums = true_working(a, b, d)
    if got[0] != carries:
        return "carry"
    return "none" if got[1] == sums else "digit"


def digit_add(question: str, plan: str) -> Parsed:
    """The tool: each sum digit from the plan's carries, and a flag where the plan's carry is not the digits'."""
    parsed_q = parse_question(question)
    m = re.fullmatch(r"carries ([01]+)", (plan or "").strip())
    if parsed_q is None or m is None or len(m.group(1)) != parsed_q[2]:
        return Parsed(False, "error", reason="bad_plan")
    a, b, d = parsed_q
    p = [int(c) for c in m.group(1)]
    ad, bd = digits_of(a, d), digits_of(b, d)
    flags = [int((ad[i] + bd[i] + (p[i - 1] if i else 0) >= 10) != p[i]) for i in range(d)]
    s = "".join(map(str, digits_from_carries(a, b, d, p)))
    return Parsed(True, f"sum {s} flags {''.join(map(str, flags))}", answer=s)


def role_example(role: str, a: int, b: int, d: int, wcfg: ArithTeamWorldConfig, rng: np.random.Generator
                 ) -> tuple[str, str]:
    """One pretraining example of ``role`` on ``a + b``: (prompt, completion)."""
    q = f"{lsb(a, d)}+{lsb(b, d)}"
    carries, sums = true_working(a, b, d)
    if role == "solver":
        return wcfg.student_template.replace("{question}", q), working(carries, sums)
    if role in ("coach", "reviser"):
        kind = int(rng.choice(3, p=np.array(wcfg.attempt_mix) / np.sum(wcfg.attempt_mix)))
        c, s, pos = corrupt(a, b, d, kind, rng)
        slots = {"question": q, "solver": working(c, s)}
        true_critique = "ok" if pos is None else f"pos {pos}"
        if role == "coach":
            return fill(wcfg.coach_template, slots), true_critique
        slots["coach"] = NO_CRITIQUE if rng.random() < wcfg.no_critique_frac else true_critique
        return fill(wcfg.reviser_template, slots), working(carries, sums)
    if role == "planner":
        return wcfg.planner_template.replace("{question}", q), "carries " + "".join(map(str, carries))
    kind = int(rng.choice(3, p=np.array(wcfg.plan_mix) / np.sum(wcfg.plan_mix)))
    plan = list(carries)
    if kind == 1:
        j = int(rng.integers(d))
        plan[j] = 1 - plan[j]
    plan_text = "carries " + "".join(map(str, plan if kind < 2 else plan[: max(d - 1, 1)]))
    slots = {"question": q, "planner": plan_text, "adder": digit_add(q, plan_text).shown}
    return fill(wcfg.verifier_template, slots), f"\\boxed{{{''.join(map(str, sums))}}}"


def fill(template: str, slots: dict[str, str]) -> str:
    """``template`` with each ``{name}`` of ``slots`` filled in one pass (``soar.coach.fill_slots``'s rule; a world
    module cannot import ``soar.coach``, which imports the worlds)."""
    return re.sub(r"\{(" + "|".join(map(re.escape, slots)) + r")\}", lambda m: slots[m.group(1)], template)


# ---- the team's parsers, tools and stand-in coach --------------------------------------------------------
@register_parser("arith_working")
def parse_arith_working(text: str) -> Parsed:
    text = (text or "").strip()
    got = parse_working(text)
    return Parsed(True, text, "".join(map(str, got[1]))) if got else Parsed(False, text, reason="no_working")


@register_parser("arith_critique", drops=True)
def parse_arith_critique(text: str) -> Parsed:
    text = (text or "").strip()
    if text == "ok":
        return Parsed(True, "ok", error_type="none")
    if re.fullmatch(r"pos \d{1,2}", text):
        return Parsed(True, text, error_type="pos")
    return Parsed(False, "", reason="not_ok_or_pos")


@register_parser("arith_plan")
def parse_arith_plan(text: str) -> Parsed:
    text = (text or "").strip()
    return Parsed(True, text) if re.fullmatch(r"carries [01]+", text) else Parsed(False, text, reason="no_plan")


@register_error_type("digit_add")
def tool_error_type(question: str, text: str) -> str:
    """What is wrong with the digit-add tool's sum: the plan was malformed (``format``) or its carries were
    wrong (``carry``: the tool adds right given the carries), or nothing (``none``)."""
    parsed_q = parse_question(question)
    if parsed_q is None:
        return "unknown"
    if text == "error":
        return "format"
    a, b, d = parsed_q
    return "none" if text.startswith(f"sum {lsb(a + b, d + 1)} ") else "carry"


@register_tool("digit_add")
def digit_add_tool(call: ToolCall) -> Parsed:
    plan = next(iter(call.inputs.values()), "")
    return digit_add(call.question, plan)


@register_tool("arith_oracle_critique", reads_reference=True)
def oracle_critique_tool(call: ToolCall) -> Parsed:
    """The true critique of the attempt, from the reference: an upper bound on any coach, never a baseline."""
    attempt = next(iter(call.inputs.values()), "")
    text = critique(call.question, attempt)
    return Parsed(True, text, error_type="none" if text == "ok" else "pos")


def leading_right(got: list[int], want: list[int]) -> int:
    n = 0
    for g, w in zip(got, want):
        if g != w:
            break
        n += 1
    return n


@register_scorer("arith_stand_in")
def stand_in_score(call: ScoreCall) -> tuple[str, float | None]:
    """A stand-in for MAPPA's LLM coach, scoring from the true sum: a plan or working by the share of its
    leading positions that are right, a critique (of the first role it read) by whether it is the true one,
    an answer by its leading
    right digits; ``team.scorer.bias`` adds ``10 x bias x`` the share of carries a plan or working claims
    (a coach that likes carries). ``team.scorer.noise`` is applied by the caller, as to any scorer."""
    parsed_q = parse_question(call.question)
    if parsed_q is None:
        return "", None
    a, b, d = parsed_q
    carries, sums = true_working(a, b, d)
    text = (call.output or "").strip()
    claimed: list[int] = []
    if call.parser == "arith_plan":
        m = re.fullmatch(r"carries ([01]+)", text)
        claimed = [int(c) for c in m.group(1)] if m else []
        score = 10 * leading_right(claimed, carries) / d if len(claimed) == d else 0.0
    elif call.parser == "arith_working":
        got = parse_working(text)
        claimed = got[0] if got else []
        pos = first_wrong(call.question, text)
        score = 10.0 if pos is None else (10 * pos / (d + 1) if got else 0.0)
    elif call.parser == "arith_critique":
        attempt = next(iter(call.inputs.values()), None)
        if attempt is None:
            return "", None
        score = 10.0 * (text == critique(call.question, attempt))
    elif call.parser == "boxed_answer":
        m = re.fullmatch(r"\\boxed\{(\d+)\}", text)
        got_digits = [int(c) for c in m.group(1)] if m else []
        score = 10 * leading_right(got_digits, sums) / (d + 1) if len(got_digits) == d + 1 else 0.0
    else:
        return "", None
    bias = call.cfg.team.scorer.bias
    if bias and claimed:
        score = min(10.0, score + 10 * bias * sum(claimed) / d)
    return f"SCORE: {score:g}", score


# ---- problems and pretraining ----------------------------------------------------------------------------
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


def pretrain(wcfg: ArithTeamWorldConfig, progress: bool = True) -> Path:
    """Build the team world model (cached; a second process waits for the first). A folder at ``out_dir`` that
    is not such a model is refused, never overwritten."""
    out = world_dir(wcfg)
    if (out / "train_info.json").exists():
        return out
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"config error: world.out_dir: {out} holds files but no team world model (train_info.json); "
                          "choose an empty or new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "train_info.json").exists():
            return out
        return _pretrain_unlocked(wcfg, out, progress)


def _pretrain_unlocked(wcfg: ArithTeamWorldConfig, out: Path, progress: bool) -> Path:
    if len(wcfg.carry_weights) > wcfg.digits + 1:
        raise ConfigError(f"config error: world.carry_weights: {len(wcfg.carry_weights)} weights but {wcfg.digits}-digit "
                          f"sums have at most {wcfg.digits} carries")
    unknown = set(wcfg.role_weights) - set(ROLES)
    if unknown:
        raise ConfigError(f"config error: world.role_weights: unknown roles {sorted(unknown)} (roles: {ROLES})")
    set_threads(wcfg.threads)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed build's own leftovers (this name is ours)
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=wcfg.hidden, layers=wcfg.layers, heads=wcfg.heads,
                             intermediate=2 * wcfg.hidden, max_positions=wcfg.max_positions, seed=wcfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=wcfg.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(wcfg.warmup_steps, 1)))
    rng = np.random.default_rng(wcfg.seed)
    roles = [r for r in ROLES if wcfg.role_weights.get(r, 0) > 0]
    role_p = np.array([wcfg.role_weights[r] for r in roles], dtype=float)
    role_p /= role_p.sum()
    carry_p = np.array(wcfg.carry_weights, dtype=float) / np.sum(wcfg.carry_weights)
    t0, losses = time.perf_counter(), []
    for step in tqdm(range(1, wcfg.max_steps + 1), desc="pretrain team", disable=not progress):
        ids, labels = [], []
        for _ in range(wcfg.batch_size):
            role = roles[int(rng.choice(len(roles), p=role_p))]
            a, b = sample_pair(rng, wcfg.digits, int(rng.choice(len(carry_p), p=carry_p)))
            prompt, completion = role_example(role, a, b, wcfg.digits, wcfg, rng)
            seq = tok(prompt + completion, add_special_tokens=False).input_ids + [tok.eos_token_id]
            ids.append(seq)
            labels.append([-100] * len(prompt) + seq[len(prompt):])  # one token per character
        opt.zero_grad()
        loss = padded_loss_backward(model, ids, labels, tok.pad_token_id)
        torch.nn.utils.clip_grad_norm_(model.parameters(), wcfg.grad_clip)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == wcfg.max_steps:
            losses.append({"step": step, "loss": loss})
    seconds = time.perf_counter() - t0
    info = {"config": asdict(wcfg), "steps": wcfg.max_steps, "seconds": seconds, "recipe": RECIPE,
            "parameters": sum(p.numel() for p in model.parameters()), "losses": losses,
            "accuracy_by_role_and_carries": role_profile(model, tok, wcfg)}
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "train_info.json").write_text(json.dumps(info, indent=2, default=str))
    if out.exists():
        out.rmdir()  # empty (``pretrain`` refused a folder holding anything)
    tmp.rename(out)
    log.info("team world model saved to %s (%d steps, %.0f s)", out, wcfg.max_steps, seconds)
    return out


def role_profile(model, tok, wcfg: ArithTeamWorldConfig) -> dict[str, dict[str, float]]:
    """Greedy accuracy of each role at each carry count (coach and reviser on the ``attempt_mix``, the reviser
    given the true critique, the verifier on the ``plan_mix``): where every role errs."""
    gen, d = HFGenerator(model, tok, batch_size=512), wcfg.digits
    with_critique = replace(wcfg, no_critique_frac=0.0)  # the reviser always given the true critique, never "?"
    out: dict[str, dict[str, float]] = {}
    for role in ROLES:
        out[role] = {}
        for c in range(d + 1):
            rng = np.random.default_rng(derive_seed(wcfg.seed, "profile", role, c))
            pairs = [sample_pair(rng, d, c) for _ in range(wcfg.profile_per_carry)]
            examples = [role_example(role, a, b, d, with_critique, rng) for a, b in pairs]
            outs = gen.generate([p for p, _ in examples], SamplingParams(greedy=True, max_tokens=2 * d + 24))
            out[role][f"c{c}"] = float(np.mean([o[0].text.strip() == w for o, (_, w) in zip(outs, examples)]))
    return out


@register_world
class ArithTeamWorld(World):
    """The embedded world for teams (``ArithTeamWorldConfig``): its model, its problems (``build_pool`` writes the
    training file and ``heldout.jsonl`` beside it), the exact answers."""

    name = "arith_team"
    config_class = ArithTeamWorldConfig

    def build_model(self, cfg) -> Path:
        return pretrain(self.config(cfg), progress=cfg.run.progress)

    def build_pool(self, cfg, out_dir: Path) -> Path:
        wcfg = self.config(cfg)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, size in (("heldout", wcfg.heldout_size), ("train", wcfg.train_size)):
            write_jsonl(out / f"{name}.jsonl", [p.to_dict() for p in team_problems(wcfg, size, wcfg.seed, name)])
        return out / "train.jsonl"

    def answer_oracle(self, cfg, question: str) -> str | None:
        parsed = parse_question(question)
        return None if parsed is None else lsb(parsed[0] + parsed[1], parsed[2] + 1)

    def run(self, cfg, command: str) -> None:
        """``soar-world pretrain`` builds the team world model; ``soar-world problems`` writes its problem files."""
        if command == "pretrain":
            print(pretrain(self.config(cfg), progress=cfg.run.progress))
        else:
            print(self.build_pool(cfg, Path(cfg.run.dir or Path("runs") / cfg.run.name)))
