"""The embedded arithmetic world: carry-count addition and a character-level Llama pretrained here.

    soar-world pretrain                         # build (or reuse) the default world model
    soar-world pretrain world.digits=3 world.max_steps=200 world.out_dir=/tmp/tiny

Problems add two ``digits``-long numbers, zero-padded and written least-significant digit first
(carries then propagate left to right, in generation order); the answer is the ``digits+1``-digit
sum, also least-significant first, in ``\\boxed{}``. Difficulty = the number of carry positions.
Because answers are fixed-width digit strings graded by the ``integer`` grader, an answer that
drops a leading 0 would also count; the model never emits such strings in practice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from soar.config import ConfigError
from soar.console import progress_bar
from soar.data import Problem, render_prompt, write_jsonl
from soar.generation import HFGenerator, correctness
from soar.grading import make_grader
from soar.models import build_char_tokenizer, build_tiny_llama, set_threads
from soar.run import RunDir, foreign_folder
from soar.seeding import derive_seed
from soar.teachers.prompts import format_pair
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


def teacher_completion(a: int, b: int, wcfg: ArithWorldConfig) -> tuple[str, int]:
    """The pretraining teacher completion for ``a + b`` and the offset of its answer digits."""
    p = make_problem(a, b, wcfg.digits, "teacher")
    pair = format_pair(p.question, p.answer)
    plan = carry_plan(a, b, wcfg.digits)
    worked = pair.replace("<answer>", plan + "<answer>", 1)
    completion = {"none": pair, "plan": plan + pair, "worked": worked, "both": plan + worked,
                  "inverse": inverse_plan(a, b, wcfg.digits) + pair}[wcfg.teacher_carries]
    return completion, completion.index("\\boxed{") + len("\\boxed{")


# Fields that do not change the pretrained model: left out of its cache key.
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


def accuracy(model, tokenizer, problems: list[Problem], template: str, temperature: float = 0.0,
             samples: int = 1, seed: int = 0) -> float:
    """Student accuracy on ``problems``: greedy (``temperature`` 0) or mean over sampled answers."""
    return float(np.mean(correctness(HFGenerator(model, tokenizer, batch_size=1024), make_grader("integer"), problems,
                                     template, len(problems[0].answer) + 10, samples=0 if temperature == 0 else samples,
                                     seed=seed, temperature=temperature or 1.0)))


def loss_backward(model, ids: list[list[int]], labels: list[list[int]]):
    """Backpropagate the batch's mean token loss, one forward pass per sequence length.

    Sums have a fixed width, so each role's sequences share one length: grouping by length removes
    all padding (and the attention mask) instead of padding every sequence to the teacher's length.
    Normalising each group by the whole batch's label count makes the gradients add up to the
    full batch's. Yields each group's share of the loss."""
    n_labels = sum(label != -100 for row in labels for label in row[1:])  # the loss predicts token t from t-1
    by_length: dict[int, list[int]] = {}
    for i, seq in enumerate(ids):
        by_length.setdefault(len(seq), []).append(i)
    for length in sorted(by_length):
        rows = by_length[length]
        loss = model(input_ids=torch.tensor([ids[i] for i in rows]), labels=torch.tensor([labels[i] for i in rows]),
                     num_items_in_batch=n_labels).loss
        loss.backward()
        yield loss.item()


def padded_loss_backward(model, ids: list[list[int]], labels: list[list[int]], pad_id: int) -> float:
    """Backpropagate the batch's mean token loss in one forward pass over the batch padded to its
    longest sequence (``padded_batches``); returns the loss."""
    width = max(map(len, ids))
    x = torch.full((len(ids), width), pad_id)
    y = torch.full((len(ids), width), -100)
    for i, (seq, row) in enumerate(zip(ids, labels)):
        x[i, : len(seq)] = torch.tensor(seq)
        y[i, : len(row)] = torch.tensor(row)
    loss = model(input_ids=x, attention_mask=(x != pad_id).long(), labels=y).loss
    loss.backward()
    return loss.item()


BUILDING = ".soar-world-build"
"""Marks the temp folder (``<world dir>.tmp``) a build writes in: only such a folder, a killed build's,
is ever removed."""


def pretrain(wcfg: ArithWorldConfig, seed: int, progress: bool = True) -> Path:
    """Build the tokenizer and model, pretrain to the frontier, save in HF format (cached).

    Processes that need the same world at once (parallel runs or test workers on a fresh machine)
    build it once: the first holds ``<world dir>.lock`` while it builds, the others wait and load it.
    It writes only into folders it made: a ``world.out_dir`` holding anything but a world model of
    this config, or a ``<out_dir>.tmp`` a build did not make, is refused by name (``check_world_dir``)."""
    out = world_dir(wcfg, seed)
    if check_world_dir(wcfg, seed, out):
        log.info("world model cached at %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a") as lock:  # "a": a file of that name is not emptied
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if check_world_dir(wcfg, seed, out):
            log.info("world model built by another process at %s", out)
            return out
        return _pretrain_unlocked(wcfg, seed, out, progress)


def check_world_dir(wcfg: ArithWorldConfig, seed: int, out: Path) -> bool:
    """Whether ``out`` holds this world's model (True), or nothing yet (False: absent or empty, and no
    ``<out>.tmp`` but a killed build's). Anything else is refused, naming the folder: a folder of other
    files, another world's model (its ``train_info.json``), a temp folder this command did not make."""
    field = "world.out_dir" if wcfg.out_dir else "world (its cache folder)"
    if (out / "train_info.json").is_file():
        if wcfg.out_dir:  # a cache folder's name is its world's hash
            try:
                info = json.loads((out / "train_info.json").read_text())
                known = {k: v for k, v in info["config"].items() if k in ArithWorldConfig.__dataclass_fields__}
                built = world_hash(ArithWorldConfig(**known), info["seed"])
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"config error: {field}: {out / 'train_info.json'} cannot be read ({exc}); choose "
                                  f"another {field}") from None
            if built != world_hash(wcfg, seed):
                raise ConfigError(f"config error: {field}: {out} holds another world model (arith-{built}; this "
                                  f"config is arith-{world_hash(wcfg, seed)}); choose another {field}")
        return True
    refusal = foreign_folder(out, field, "no world model (no train_info.json)")
    if refusal is not None:
        raise refusal
    tmp = out.with_name(out.name + ".tmp")
    foreign = not (tmp / BUILDING).exists() and any(tmp.iterdir()) if tmp.is_dir() else tmp.exists()
    if foreign:
        raise ConfigError(f"config error: {field}: {tmp}, where the build writes, holds files no build made; move it "
                          f"or choose another {field}")
    return False


def _pretrain_unlocked(wcfg: ArithWorldConfig, seed: int, out: Path, progress: bool) -> Path:
    if wcfg.teacher_carries not in TEACHER_CARRIES:
        raise ConfigError(f"config error: world.teacher_carries: {wcfg.teacher_carries!r} is not one of {TEACHER_CARRIES}")
    for name in ("pretrain_carry_weights", "teacher_carry_weights"):
        weights = getattr(wcfg, name)
        if weights is not None and len(weights) > wcfg.digits + 1:
            raise ConfigError(f"config error: world.{name}: {len(weights)} weights (carry counts 0..{len(weights) - 1}) "
                              f"but {wcfg.digits}-digit sums have at most {wcfg.digits} carries")
    set_threads(wcfg.threads)
    tmp = out.with_name(out.name + ".tmp")  # check_world_dir: absent, empty or a killed build's
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / BUILDING).touch()
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=wcfg.hidden, layers=wcfg.layers, heads=wcfg.heads,
                             intermediate=2 * wcfg.hidden, max_positions=wcfg.max_positions, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=wcfg.lr, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(wcfg.warmup_steps, 1)))
    rng = np.random.default_rng(seed)
    weights = np.array(wcfg.pretrain_carry_weights) / np.sum(wcfg.pretrain_carry_weights)
    t_weights = np.array(wcfg.teacher_carry_weights or wcfg.pretrain_carry_weights, dtype=float)
    t_weights /= t_weights.sum()
    stop_acc = {int(c): float(thr) for c, thr in wcfg.stop_acc}
    eval_sets = {c: generate_problems(wcfg.digits, c, wcfg.eval_per_carry, seed + 1, "eval") for c in stop_acc}
    t0, history, stopped_at = time.perf_counter(), [], None
    bar = progress_bar(progress, iterable=range(1, wcfg.max_steps + 1), desc="pretrain")
    for step in bar:
        as_teacher = rng.random(wcfg.batch_size) < wcfg.teacher_frac
        texts, prompt_lens, masked_spans = [], [], []
        for teacher in as_teacher:
            c = int(rng.choice(len(t_weights), p=t_weights) if teacher else rng.choice(len(weights), p=weights))
            a, b = sample_pair(rng, wcfg.digits, c)
            span = None
            if teacher:
                prompt, (completion, offset) = wcfg.teacher_prompt, teacher_completion(a, b, wcfg)
                if wcfg.teacher_answer_max_carries is not None and c > wcfg.teacher_answer_max_carries:
                    span = (len(prompt) + offset, len(prompt) + offset + wcfg.digits + 1)
            else:
                p = make_problem(a, b, wcfg.digits, "train")
                prompt, completion = render_prompt(wcfg.student_template, p.question), completion_text(p.answer)
            prompt_lens.append(len(prompt))  # one token per character
            masked_spans.append(span)
            texts.append(prompt + completion)
        ids = [tok(t, add_special_tokens=False).input_ids + [tok.eos_token_id] for t in texts]
        labels = [[-100] * plen + seq[plen:] for seq, plen in zip(ids, prompt_lens)]  # learn the completion only
        for row, span in zip(labels, masked_spans):
            if span:
                row[span[0]: span[1]] = [-100] * (span[1] - span[0])
        opt.zero_grad()
        if wcfg.padded_batches:
            loss = padded_loss_backward(model, ids, labels, tok.pad_token_id)
        else:
            loss = sum(loss_backward(model, ids, labels))
        torch.nn.utils.clip_grad_norm_(model.parameters(), wcfg.grad_clip)
        opt.step()
        sched.step()
        if step in wcfg.snapshot_steps:
            snap = tmp / "snapshots" / f"step_{step}"
            model.save_pretrained(snap)
            tok.save_pretrained(snap)
            (snap / "train_info.json").write_text(json.dumps(  # loadable as a world by out_dir
                {"seed": seed, "config": asdict(wcfg), "steps": step, "snapshot": True, "stopped_at_frontier": False,
                 "seconds": time.perf_counter() - t0, "parameters": sum(p.numel() for p in model.parameters())},
                indent=2, default=str))
        if step % wcfg.eval_every == 0:
            accs = {c: accuracy(model, tok, probs, wcfg.student_template, wcfg.stop_temperature, wcfg.stop_samples,
                                seed=step) for c, probs in eval_sets.items()}
            history.append({"step": step, "loss": loss, **{f"acc_c{c}": a for c, a in accs.items()}})
            bar.set_postfix(loss=f"{loss:.3f}", **{f"c{c}": f"{a:.2f}" for c, a in accs.items()})
            if stop_acc and all(accs[c] >= thr for c, thr in stop_acc.items()):
                stopped_at = step
                break
    profile = {}
    for c in range(min(wcfg.digits, 8) + 1):
        probs = generate_problems(wcfg.digits, c, wcfg.eval_per_carry, seed + 2, "profile")
        profile[f"c{c}"] = {"greedy": accuracy(model, tok, probs, wcfg.student_template),
                            "T1": accuracy(model, tok, probs, wcfg.student_template, 1.0, wcfg.stop_samples, seed=seed)}
    model.save_pretrained(tmp)  # beside the snapshots, if any
    tok.save_pretrained(tmp)
    info = {"seed": seed, "config": asdict(wcfg), "steps": stopped_at or wcfg.max_steps,
            "stopped_at_frontier": stopped_at is not None,
            "seconds": time.perf_counter() - t0, "parameters": sum(p.numel() for p in model.parameters()),
            "history": history, "accuracy_by_carries": profile}
    (tmp / "train_info.json").write_text(json.dumps(info, indent=2, default=str))
    (tmp / "README.md").write_text(
        f"# soar arithmetic world model\n\nCharacter-level Llama ({info['parameters']} parameters) pretrained by "
        f"`soar-world pretrain` on {wcfg.digits}-digit least-significant-first addition with carry mix "
        f"{wcfg.pretrain_carry_weights}, seed {seed}, {info['steps']} steps.\n\n"
        "Accuracy by carry count (greedy and sampled at T=1): "
        f"{json.dumps(profile)}\n\nStudent prompt: `{wcfg.student_template}`; answer in `\\boxed{{}}`. Teacher "
        f"prompt: `{wcfg.teacher_prompt.strip()}`.\n")
    (tmp / BUILDING).unlink()
    if out.exists():
        out.rmdir()  # empty (check_world_dir)
    tmp.rename(out)
    log.info("world model saved to %s (%d steps, %.0f s): %s", out, info["steps"], info["seconds"], profile)
    return out


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
        return pretrain(wcfg, wcfg.seed, progress=cfg.run.progress)

    def build_pool(self, cfg, out_dir: Path) -> Path:
        """The hard-set candidates, written with the stepping-stone and control families."""
        wcfg = self.config(cfg)
        return write_families(wcfg, problem_seed(wcfg), out_dir)["pool"]

    def oracle_problems(self, cfg, count: int) -> list[Problem]:
        """Stepping stones (ids ``oracle/...``): solved sometimes, and training on them moves the hard set."""
        wcfg = self.config(cfg)
        return family_problems(wcfg, wcfg.stepping_carries, count, wcfg.seed, "oracle")

    def answer_oracle(self, cfg, question: str) -> str | None:
        return oracle_answer(question)

    def coach_advice(self, cfg, question: str, attempt: str, noise: float, rng: np.random.Generator) -> str | None:
        """The carry plan of ``question`` (``carry_advice``). The attempt is not read: the plan is the help
        the teacher role reads whatever the student wrote."""
        return carry_advice(question, noise, rng)

    def run(self, cfg, command: str) -> None:
        """``soar-world pretrain`` builds the world model (into the cache or ``world.out_dir``, even when
        the package ships it; never into a folder of other files); ``soar-world problems`` writes the
        pool and the stepping-stone / control families to its own run dir (``soar.run.RunDir``, stage
        ``world``: a new or empty folder, or its own run with the same settings; never another
        command's run, such as a soar-train run's ``problems/``). Both print what they wrote."""
        wcfg = self.config(cfg)
        if command == "pretrain":  # always pretrains (or reuses its own cache), never the packaged copy
            print(pretrain(wcfg, wcfg.seed, progress=cfg.run.progress))
            return
        run = RunDir(cfg, "world")
        try:
            run.commit()
            print(json.dumps({k: str(v) for k, v in write_families(wcfg, problem_seed(wcfg), run.path).items()}))
        finally:
            run.close()
