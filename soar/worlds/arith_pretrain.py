"""Pretraining the embedded arithmetic world's model (``soar.worlds.arith``): a character-level Llama trained
on both roles' formats, to the frontier, saved in HF format under its config hash (cached, built once when
processes race). ``ArithWorld.build_model`` and ``soar-world pretrain`` import it: it needs torch, the world's
domain does not.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from soar.config import ConfigError
from soar.console import progress_bar
from soar.data import Problem, render_prompt
from soar.generation import HFGenerator, correctness
from soar.grading import make_grader
from soar.models import build_char_tokenizer, build_tiny_llama, set_threads
from soar.run import foreign_folder
from soar.teachers.prompts import format_pair
from soar.worlds.arith import (
    TEACHER_CARRIES,
    ArithWorldConfig,
    carry_plan,
    completion_text,
    generate_problems,
    inverse_plan,
    make_problem,
    sample_pair,
    world_dir,
    world_hash,
)

log = logging.getLogger("soar.world")


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
