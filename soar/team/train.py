"""``soar-team``: a chain of roles trained with RL (issue 60; docs/team.md), with resume and metrics.

    soar-team experiment=team_scr_arith_micro                    # recipe A in the micro world (CPU, minutes)
    soar-team experiment=team_mappa_arith_micro                  # MAPPA in the micro world
    soar-team experiment=team_scr_math model.path=...            # recipe A at paper scale (GPU; not run here)

Per step: ``student.questions_per_step`` problems (``soar.students.trainer.batch_indices``), each run through
the chain ``student.group_size`` times (``soar.team.rollout.run_chain``); the process coach scores the actions
when the credit reads scores; the credit function (``team.credit``) gives each trained token its advantage;
each agent (one shared policy, or one per trained role) takes one ``RLOOTrainer.update`` on its roles' tokens.
Held-out evaluation (greedy chains, or ``team.eval_samples`` sampled ones) at step 0, every
``student.eval_every`` steps and at the end. The run directory is ``soar-rl``'s contract (``soar.stage``):
checkpoints every ``student.save_every`` steps hold every agent; a killed run resumes from the last one and
repeats the steps after it exactly (every sample is seeded by the run seed, the step and the role).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from soar.config import ConfigError
from soar.data import load_problems, problems_hash
from soar.generation import HFGenerator, make_generator
from soar.grading import make_grader
from soar.hydra_config import data_group
from soar.metrics_log import MetricsLogger
from soar.models import load_model
from soar.policy.rloo import completion_values, pack_sequences, token_logprobs
from soar.policy.trainer import RLOOTrainer
from soar.resolve import resolve_backend
from soar.run import atomic_write_text, load_checkpoint_state
from soar.seeding import derive_seed
from soar.stage import setup_stage
from soar.students.trainer import batch_indices, sharing_copy
from soar.team.checks import validate_team
from soar.team.credit import CREDITS, CreditParams, assign, groups_without_signal
from soar.team.episode import credit_inputs
from soar.team.metrics import episode_metrics
from soar.team.rollout import BASE_AGENT, SHARED_AGENT, ChainRun, chain_info, make_scorer, run_chain, score_turns
from soar.tokens import encode_prompts
from soar.worlds.base import build_pool_hook

log = logging.getLogger("soar.team")
HELDOUT_FILE = "heldout.jsonl"
"""A world's held-out problems, written beside the training file its ``build_pool`` returns."""


def read_eval_problems(cfg, eval_path: str | None) -> list:
    problems = load_problems(cfg.data, eval_path) if eval_path else []
    for name in cfg.team.eval_data:
        problems += load_problems(data_group(name))
    return problems


def check_role_prompts(stage, cfg, problems) -> None:
    """Every policy role's prompt, its slots empty, plus its ``max_tokens`` fits the context (what the earlier
    roles write is checked when it is written)."""
    for name in cfg.team.chain:
        role = cfg.team.roles[name]
        if role.tool:
            continue
        prompts = [role.template.replace("{question}", p.question) for p in problems]
        for r in role.sees:
            prompts = [t.replace("{" + r + "}", "") for t in prompts]
        stage.check_prompts(prompts, role.max_tokens, f"team.roles.{name}.max_tokens", [p.id for p in problems])


def build_agents(cfg, base, tokenizer, grader) -> tuple[dict[str, RLOOTrainer], dict]:
    """The trainers (one per trained agent) and the generators of every agent. ``shared``: one policy, the base
    model itself (LoRA: its adapter); ``per_role``: each trained role a LoRA on one shared frozen base
    (``sharing_copy``) or a copy of it; untrained roles there write from the frozen base."""
    s, team = cfg.student, cfg.team
    info = chain_info(team)
    needs_ref = s.lora.r == 0 and (s.kl_coef > 0 or (CREDITS[team.credit].needs_kl and team.kl_reward_coef > 0))
    vllm = resolve_backend(cfg.backend, "student") == "vllm"
    trainers, generators = {}, {}
    if team.sharing == "shared":
        ref = load_model(cfg.model) if needs_ref else None
        trainers[SHARED_AGENT] = RLOOTrainer(base, tokenizer, grader, s, "{question}", cfg.seed, ref_model=ref,
                                             batch_size=cfg.backend.batch_size, role="team",
                                             generator=make_generator(cfg, "student", base, tokenizer) if vllm else None)
    else:
        base.requires_grad_(False)
        for name in info.trained:
            model = sharing_copy(base) if s.lora.r > 0 else copy.deepcopy(base).requires_grad_(True)
            trainers[name] = RLOOTrainer(model, tokenizer, grader, s, "{question}", derive_seed(cfg.seed, "agent", name),
                                         ref_model=base if needs_ref else None, batch_size=cfg.backend.batch_size,
                                         role=f"team {name}",
                                         generator=make_generator(cfg, "student", model, tokenizer) if vllm else None)
        if any(r not in info.trained and not team.roles[r].tool for r in team.chain):
            generators[BASE_AGENT] = (make_generator(cfg, "student", base, tokenizer, pristine=True) if vllm else
                                      HFGenerator(base, tokenizer, batch_size=cfg.backend.batch_size))
    return trainers, generators


@torch.no_grad()
def token_kl(trainer: RLOOTrainer, prompt_ids, completion_ids) -> list[list[float]]:
    """Per completion token, ``log pi - log pi_ref`` of the sampled token under the current policy and its
    reference, at the rollouts' temperature: the KL estimate MAPPA's reward subtracts."""
    out, mb = [], trainer.cfg.micro_batch_size
    for start in range(0, len(completion_ids), mb):
        sl = slice(start, start + mb)
        ids, attn, _ = (t.to(trainer.model.device) for t in pack_sequences(prompt_ids[sl], completion_ids[sl],
                                                                            trainer.tokenizer.pad_token_id))
        diff = token_logprobs(trainer.model, ids, attn, trainer.cfg.temperature) - trainer.reference_logprobs(ids, attn)
        out += completion_values(diff.float().cpu(), prompt_ids[sl], completion_ids[sl])
    return out


def dump_episodes(path: Path, episodes, adv_by_turn: dict[int, float]) -> None:
    rows = []
    for e in episodes:
        turns = {}
        for name, t in e.turns.items():
            turns[name] = {"text": t.text, "shown": t.parsed.shown, "parsed": t.parsed.ok, "reason": t.parsed.reason,
                           "answer": t.parsed.answer, "correct": t.correct, "leaked": t.leaked, "score": t.score,
                           "score_text": t.score_text, "score_dropped": t.score_dropped,
                           "adv_mean": adv_by_turn.get(id(t))}
        sibling = None if e.without_critique is None else {"text": e.without_critique.text,
                                                           "correct": e.without_critique.correct}
        rows.append({"question": e.question, "answer": e.answer, "group": e.group, "dropped": e.dropped, "turns": turns,
                     "without_critique": sibling})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def run_team(cfg) -> dict:
    """The ``soar-team`` stage."""
    s, team = cfg.student, cfg.team

    def read_problems(stage):  # before the run dir is written; a world's pool is written after
        if not cfg.data.path:
            return None
        problems, evals = load_problems(cfg.data), read_eval_problems(cfg, cfg.data.eval_path)
        check_role_prompts(stage, cfg, problems + evals)
        return problems, evals

    stage = setup_stage(cfg, "team", checks=lambda: validate_team(cfg), prepare=read_problems)
    run, tokenizer, base = stage.run, stage.tokenizer, stage.model
    try:
        if stage.prepared is None:  # data.build: the world writes its problems into the run dir, once
            train_path = run.path / "problems" / "train.jsonl"
            if not train_path.exists():
                train_path = build_pool_hook(cfg, run.path / "problems")
            heldout = train_path.parent / HELDOUT_FILE
            problems = load_problems(cfg.data, str(train_path))
            evals = read_eval_problems(cfg, cfg.data.eval_path or (str(heldout) if heldout.exists() else None))
            check_role_prompts(stage, cfg, problems + evals)
        else:
            problems, evals = stage.prepared
        hashes = {"train": problems_hash(problems), "eval": problems_hash(evals) if evals else None}
        recorded = run.record_once("problems.json", hashes)
        if recorded != hashes:
            raise ConfigError(f"config error: data.path: {run.path} was trained on other problems (problems.json: "
                              f"{recorded}, now {hashes}); use the run's problems or a new run.dir")
        grader = make_grader(cfg.data.grader)
        info, credit = chain_info(team), CREDITS[team.credit]
        params = CreditParams(team.fix_bonus, team.kl_reward_coef, team.gamma, team.outcome_weight, team.coach_role)
        trainers, frozen = build_agents(cfg, base, tokenizer, grader)
        scorer = make_scorer(cfg) if credit.needs_scores else None
        start = 0
        if run.resume_from is not None:
            state = load_checkpoint_state(run.resume_from / "state.pt")
            for name, trainer in trainers.items():
                trainer.load_state_dict(state["agents"][name])
            start = state["step"]
            log.info("resumed from %s (step %d)", run.resume_from, start)
        metrics_log = MetricsLogger(run, resume_step=start if run.resume_from is not None else None)

        def generators() -> dict:
            return {**frozen, **{name: trainer.sampler() for name, trainer in trainers.items()}}

        def eval_metrics(step: int) -> dict:
            episodes = run_chain(cfg, evals, ChainRun("eval", step, team.eval_samples == 0, team.eval_temperature,
                                                      max(team.eval_samples, 1), credit.needs_sibling),
                                 generators(), tokenizer, grader, stage.context)
            out = episode_metrics(episodes, info, "eval/")
            sources = sorted({e.source for e in episodes})
            if len(sources) > 1:
                for src in sources:
                    out.update(episode_metrics([e for e in episodes if e.source == src], info, f"eval/{src}/"))
            return out

        if evals and start == 0:
            metrics_log.log(0, eval_metrics(0))
        last: dict = {}
        bar = tqdm(range(start, s.max_steps), desc="soar-team", initial=start, total=s.max_steps,
                   disable=not cfg.run.progress, unit="step")
        for step in bar:
            t0 = time.perf_counter()
            batch = [problems[i] for i in batch_indices(len(problems), step, s.questions_per_step, cfg.seed)]
            grader.reset_stats()
            episodes = run_chain(cfg, batch, ChainRun("rollout", step, False, s.temperature, s.group_size,
                                                      credit.needs_sibling), generators(), tokenizer, grader, stage.context)
            t_rollout = time.perf_counter()
            if scorer is not None:
                score_turns(cfg, episodes, scorer, step)
            t_score = time.perf_counter()
            records, actions, turns = credit_inputs(episodes, info, credit.needs_scores)
            prompt_ids = encode_prompts(tokenizer, [t.prompt for t in turns])
            completion_ids = [t.token_ids for t in turns]
            kl = [None] * len(turns)
            if credit.needs_kl and team.kl_reward_coef > 0:
                for name, trainer in trainers.items():
                    rows = [i for i, a in enumerate(actions) if a.agent == name]
                    values = token_kl(trainer, [prompt_ids[i] for i in rows], [completion_ids[i] for i in rows])
                    for i, v in zip(rows, values):
                        kl[i] = v
            result = assign(team.credit, records, actions, kl, params)
            last = episode_metrics(episodes, info, "team/")
            last.update({f"team/{r}/frac_groups_no_signal": v
                         for r, v in groups_without_signal(records, actions, result.rewards).items()})
            for role in info.trained:
                advs = [abs(x) for a, v in zip(actions, result.token_adv) if a.role == role for x in v]
                if advs:
                    last[f"team/{role}/adv_abs_mean"] = float(np.mean(advs))
            for name, trainer in trainers.items():
                rows = [i for i, a in enumerate(actions) if a.agent == name]
                adv = [result.token_adv[i] for i in rows]
                stats = trainer.update([prompt_ids[i] for i in rows], [completion_ids[i] for i in rows],
                                       torch.tensor([float(np.mean(v)) if v else 0.0 for v in adv]), token_adv=adv)
                last.update({f"agent/{name}/{k}": float(stats[k]) for k in ("pg_loss", "kl", "grad_norm", "lr", "skipped")})
                last[f"agent/{name}/actions"] = float(len(rows))
            last.update(grader.stats.as_metrics())
            t_update = time.perf_counter()
            last.update({"time/rollout_s": t_rollout - t0, "time/score_s": t_score - t_rollout,
                         "time/credit_update_s": t_update - t_score})
            done = step + 1
            if team.dump_every and done % team.dump_every == 0:
                adv_by_turn = {id(t): float(np.mean(v)) for t, v in zip(turns, result.token_adv) if v}
                dump_episodes(run.path / "episodes" / f"step_{done:06d}.jsonl", episodes, adv_by_turn)
            if evals and (done == s.max_steps or s.eval_every and done % s.eval_every == 0):
                t_eval = time.perf_counter()
                last.update(eval_metrics(done))
                last["time/eval_s"] = time.perf_counter() - t_eval
            last["time/step_s"] = time.perf_counter() - t0
            metrics_log.log(done, last)
            bar.set_postfix(before=f"{last.get('team/accuracy_before', 0):.2f}",
                            after=f"{last.get('team/accuracy_after', 0):.2f}")
            if done % s.save_every == 0 or done == s.max_steps:
                with run.checkpoint(done) as ckpt:
                    torch.save({"step": done, "agents": {n: t.state_dict() for n, t in trainers.items()}}, ckpt / "state.pt")
        for name, trainer in trainers.items():
            trainer.save_pretrained(run.path / "final" / name)
        summary = {"steps": s.max_steps, "agents": sorted(trainers), "train_problems": len(problems),
                   "eval_problems": len(evals), "credit": team.credit, "last": last}
        atomic_write_text(run.path / "summary.json", json.dumps(summary, indent=2, default=float))
        metrics_log.close()
        return summary
    finally:
        stage.close()
