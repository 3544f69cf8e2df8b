"""Pretraining the team world's model (``soar.worlds.arith_team``): one character-level Llama on every role's
format, on sums of at most the frontier's carries (``world.carry_weights``), cached under its config hash.
``ArithTeamWorld.build_model`` imports it: it needs torch, the world's domain does not.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from soar.coach import fill_slots
from soar.config import ConfigError
from soar.generation import HFGenerator
from soar.models import build_char_tokenizer, build_tiny_llama, set_threads
from soar.samples import SamplingParams
from soar.seeding import derive_seed
from soar.worlds.arith import lsb, sample_pair
from soar.worlds.arith_pretrain import padded_loss_backward
from soar.worlds.arith_team import (
    NO_CRITIQUE,
    RECIPE,
    ROLES,
    ArithTeamWorldConfig,
    corrupt,
    true_working,
    working,
    world_dir,
)
from soar.worlds.arith_team_formats import digit_add

log = logging.getLogger("soar.world")


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
            return fill_slots(wcfg.coach_template, **slots), true_critique
        slots["coach"] = NO_CRITIQUE if rng.random() < wcfg.no_critique_frac else true_critique
        return fill_slots(wcfg.reviser_template, **slots), working(carries, sums)
    if role == "planner":
        return wcfg.planner_template.replace("{question}", q), "carries " + "".join(map(str, carries))
    kind = int(rng.choice(3, p=np.array(wcfg.plan_mix) / np.sum(wcfg.plan_mix)))
    plan = list(carries)
    if kind == 1:
        j = int(rng.integers(d))
        plan[j] = 1 - plan[j]
    plan_text = "carries " + "".join(map(str, plan if kind < 2 else plan[: max(d - 1, 1)]))
    slots = {"question": q, "planner": plan_text, "adder": digit_add(q, plan_text).shown}
    return fill_slots(wcfg.verifier_template, **slots), f"\\boxed{{{''.join(map(str, sums))}}}"


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
