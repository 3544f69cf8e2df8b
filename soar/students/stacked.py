"""Stacked students (``resources.batched=true``): the g·r students of an outer step trained as one model
with stacked weights (``soar.stacked_llama``), one inner step at a time.

    soar-train experiment=arith resources.batched=true

Each student gets exactly what ``soar.students.trainer.train_student`` gives it alone: its seed
(``derive_seed(seed, "student", step, group, k, j)``), its batches (``batch_indices``), its rollouts (the
same per-row draws, ``soar.samples``), its grades, RLOO advantages, loss (``rloo_loss``), gradient
clipping, AdamW update (``torch.optim.adamw.adamw`` on its slice, with its own step count), learning-rate
schedule, zero-advantage skips, Q_R score and metrics. What changes is the arithmetic's layout: one
batched matrix product per layer for all students, each question's prompt run once for its samples (in
sampling and in the training pass), the rollouts of all students decoded together with a KV cache. Results
agree with the one-by-one path to float rounding (tests/test_stacked_students.py states the tolerance).

Full fine-tuning of Llama-architecture students only (``student.lora.r=0``): the g·r copies live in this
process, so it is for models small enough that g·r copies of weights, gradients and AdamW state fit
(the embedded world's 0.7 M-parameter model: 16 copies are 50 MB). A bf16/fp16 stack trains through fp32
master copies (``StackedOptimizer``), like ``RLOOTrainer``'s ``precision=mixed``. Not a path for 3B
students: a prompt's completion tree attends densely over its nodes, (n x L)^2 scores per head at n
samples of L tokens (32 x 1024: 10^9), where the world's answers are a few tokens long.
"""

from __future__ import annotations

import copy
import time
import warnings

import torch
from torch.optim.adamw import adamw

from soar.data import render_prompt
from soar.generation import HFGenerator, SamplingParams, finish_sample, grade_correctness
from soar.policy.rloo import weighted_rloo_loss
from soar.policy.scores import Measures, gold_completion_ids, score
from soar.policy.trainer import MasterWeights, cosine_schedule, grade_rollouts, non_finite_loss, rollout_metrics
from soar.samples import sampling_uniforms
from soar.seeding import derive_seed
from soar.stacked_llama import CompletionTree, StackedLlama
from soar.students.executor import StudentExecutor, StudentHandle
from soar.students.trainer import StudentResult, batch_indices
from soar.tokens import encode_prompts, stop_token_ids


def pad_left(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids (N, P) left-padded to the longest row, and the mask of real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


def pad_right(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids (N, C) right-padded to the longest row (at least 1), and the mask of real tokens."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1.0
    return ids, mask


def learning_rates(policy_cfg, steps: int) -> list[float]:
    """The learning rate of each of ``steps`` optimiser steps (``cosine_schedule``, as ``RLOOTrainer``)."""
    schedule = cosine_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=policy_cfg.lr), policy_cfg, steps)
    out = []
    with warnings.catch_warnings():  # the schedule alone is read; no optimiser step comes first
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for _ in range(steps):
            out.append(schedule.get_last_lr()[0])
            schedule.step()
    return out


def tree_chunks(completions_SQ, max_questions: int, at_least: int) -> list[list[list[int]]]:
    """The chunks of each student's questions its training pass runs in: at most ``max_questions`` per chunk
    (at least 1), at least ``at_least`` chunks, and each student's questions ordered by the size of their
    completion tree, so a chunk's trees are alike and padding them to one size wastes little."""
    Q = len(completions_SQ[0])
    count = min(Q, max(at_least, -(-Q // max(1, max_questions))))
    bounds = [round(Q * j / count) for j in range(count + 1)]
    orders = [sorted(range(Q), key=lambda q: inner_nodes(student[q])) for student in completions_SQ]
    return [[order[lo:hi] for order in orders] for lo, hi in zip(bounds, bounds[1:])]


def inner_nodes(completions: list[list[int]]) -> int:
    """Distinct proper prefixes of ``completions``: the nodes of their tree that the model runs."""
    return len({tuple(c[:i]) for c in completions for i in range(1, len(c))})


class StackedStudent(StudentHandle):
    """A trained student of the stack, standing in for its ``RLOOTrainer`` (as the Ray pool's
    ``RemoteStudent`` does): ``model``, ``sampler``, ``export_model`` and ``save_pretrained`` read its
    weights, copied into a model of the baseline's architecture on first use."""

    def __init__(self, stack, index: int, baseline, tokenizer, batch_size: int):
        self.stack, self.index, self.baseline, self.tokenizer = stack, index, baseline, tokenizer
        self.batch_size, self._model = batch_size, None

    @property
    def model(self):
        if self._model is None:
            self._model = self.stack.copy_into(copy.deepcopy(self.baseline), self.index)
        return self._model

    def sampler(self, generator=None):
        generator = generator or HFGenerator(self.model, self.tokenizer, self.batch_size)
        generator.sync_weights(self.model)
        return generator

    def policy(self):
        return self.model

    def keep_policy_only(self) -> None:
        pass


class StackedOptimizer:
    """Each stacked student's AdamW on its slice of the stack, with its own step count, after clipping its
    gradient to ``max_grad_norm`` (as ``clip_grad_norm_``). A low-precision (bf16/fp16) stack under
    ``precision=mixed`` steps fp32 master copies instead, its gradients accumulating into theirs in fp32
    as backward produces them, and gets their rounding after each step (``MasterWeights``, as
    ``RLOOTrainer``); an fp32 stack steps its own weights."""

    def __init__(self, stack: StackedLlama, policy_cfg):
        self.stack, self.cfg = stack, policy_cfg
        self.master = MasterWeights(list(stack.params.values())) if policy_cfg.precision == "mixed" else None
        masters = self.master.by_param() if self.master is not None else {}
        self.weights = {name: masters.get(id(p), p) for name, p in stack.params.items()}
        """What AdamW steps: per stacked tensor its fp32 master, or the tensor itself."""
        self.moments = {name: (torch.zeros_like(w), torch.zeros_like(w)) for name, w in self.weights.items()}
        self.steps = [[torch.tensor(0.0) for _ in self.weights] for _ in range(stack.copies)]  # per student, tensor

    def step(self, train: list[int], lrs: list[float]) -> dict[int, float]:
        """Per ``train`` student (at its learning rate in ``lrs``): clip and step; returns its pre-clip
        gradient norm. Gradients are cleared."""
        cfg, names = self.cfg, list(self.weights)
        norms = {}
        with torch.no_grad():
            for s, lr in zip(train, lrs):
                grads = [self.weights[name].grad[s] for name in names]
                total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
                clip = torch.clamp(max_norm / (total + 1e-6), max=1.0)
                for g in grads:
                    g.mul_(clip.to(g.dtype))
                norms[s] = total.item()
                adamw([self.weights[name][s] for name in names], grads,
                      [self.moments[name][0][s] for name in names], [self.moments[name][1][s] for name in names], [],
                      self.steps[s], foreach=False, amsgrad=False, beta1=cfg.adam_betas[0],
                      beta2=cfg.adam_betas[1], lr=lr, weight_decay=cfg.weight_decay, eps=1e-8, maximize=False)
            for w in self.weights.values():
                w.grad = None
            for p in self.stack.params.values():
                p.grad = None
        if self.master is not None:
            self.master.copy_to_model()
        return norms

    def close(self) -> None:
        if self.master is not None:
            self.master.remove()


class StackedStudents(StudentExecutor):
    """``resources.batched``: ``run`` trains a step's student tasks as one stacked model, and
    ``score_baseline`` scores the baseline in the stack's layout."""

    tree_chunks = 2
    """Each inner step's training pass runs in at least this many chunks of questions, grouped by the size
    of their completion trees (``tree_chunks``), so trees padded to one size waste little."""

    def __init__(self, cfg, tokenizer, grader, template: str):
        super().__init__(cfg, tokenizer, grader, template)
        self.baseline = None

    def run(self, tasks, baseline, reward_questions, progress=None) -> list[StudentResult]:
        scfg = self.cfg.student
        self.baseline = baseline
        stack = StackedLlama(baseline, len(tasks))
        # The reference (the baseline, as each student starts) and, per set of active students, their
        # datasets' prompts under it: fixed weights, so those prompts run once per outer step.
        reference = {name: p.detach().clone() for name, p in stack.params.items()} if scfg.kl_coef > 0 else None
        reference_prompts = {}
        seeds = [derive_seed(self.cfg.seed, "student", *task.key) for task in tasks]
        schedules = {k: learning_rates(scfg, k) for k in {task.inner_steps for task in tasks}}
        optimizer = StackedOptimizer(stack, scfg)
        histories = [[] for _ in tasks]
        for step in range(max(task.inner_steps for task in tasks)):
            active = [s for s, task in enumerate(tasks) if step < task.inner_steps]
            t0 = time.perf_counter()
            picks = [batch_indices(len(tasks[s].problems), step, scfg.questions_per_step, seeds[s]) for s in active]
            batches = [[tasks[s].problems[i] for i in pick] for s, pick in zip(active, picks)]
            scorer = None  # at inner step 0 the students hold the reference's weights: their log-probs are its
            if step > 0 and reference is not None:
                ref_params = self._select(reference, active, len(tasks))
                if tuple(active) not in reference_prompts:
                    ids, mask = self._prompts([list(tasks[s].problems) for s in active], baseline.device)
                    with torch.no_grad():
                        reference_prompts[tuple(active)] = stack.prefill(ref_params, ids, mask)
                scorer = (ref_params, reference_prompts[tuple(active)])
            rollouts = self._rollouts(stack, scorer, active, len(tasks), batches, picks,
                                      [derive_seed(seeds[s], "rollout", step) for s in active], step)
            t_backward = time.perf_counter()
            trained = [s for s, r in zip(active, rollouts) if not r["skipped"]]
            grad_norms = optimizer.step(trained, [schedules[tasks[s].inner_steps][step] for s in trained])
            t_end = time.perf_counter()
            share = 1.0 / len(active)
            for s, r in zip(active, rollouts):
                histories[s].append({
                    **r["metrics"], "student/skipped_zero_adv": int(r["skipped"]),
                    "student/lr": schedules[tasks[s].inner_steps][step],
                    "student/pg_loss": r["pg_loss"], "student/kl": r["kl"], "student/grad_norm": grad_norms.get(s, 0.0),
                    "time/sample_s": r["sample_s"] * share, "time/sync_s": 0.0, "time/grade_s": r["grade_s"] * share,
                    "time/train_s": (t_end - t0 - r["sample_s"] - r["grade_s"]) * share,
                    "time/forward_backward_s": (t_backward - t0 - r["sample_s"] - r["grade_s"]) * share,
                    "time/optimizer_s": (t_end - t_backward) * share})
        optimizer.close()
        scores = self._score(stack, [derive_seed(seed, "eval") for seed in seeds], reward_questions,
                             self.cfg.inner.reward_metric, stop_token_ids(self.tokenizer, baseline))
        students = [StackedStudent(stack, s, baseline, self.tokenizer, self.cfg.backend.batch_size)
                    for s in range(len(tasks))]
        return self.finish(tasks, scores, histories, students, progress=progress)

    # ---- pieces of one inner step ---------------------------------------------------------------
    def _prompts(self, batches, device):
        """The students' prompts (S, Q, P), left-padded to one width, and their mask."""
        rows = [encode_prompts(self.tokenizer, [render_prompt(self.template, p.question) for p in batch])
                for batch in batches]
        ids, mask = pad_left([r for student in rows for r in student], self.tokenizer.pad_token_id)
        return ids.view(len(batches), -1, ids.shape[-1]).to(device), mask.view(len(batches), -1, ids.shape[-1]).to(device)

    @staticmethod
    def _select(params, rows: list[int], copies: int):
        """The stacked tensors of copies ``rows`` (the tensors themselves when that is every copy)."""
        if rows == list(range(copies)):
            return params
        index = torch.tensor(rows, device=next(iter(params.values())).device)
        return {name: p.index_select(0, index) for name, p in params.items()}

    def _rollouts(self, stack, scorer, active, copies, batches, picks, seeds, step) -> list[dict]:
        """One inner step's rollouts of the ``active`` students, graded, with the gradients of their RLOO
        losses accumulated in the stack's ``.grad``. Each prompt's completions are a prefix tree
        (``CompletionTree``), scored by the students and, for the KL, by ``scorer`` (the reference's weights
        and its prefilled datasets, read at the batch's dataset indices ``picks``; None: the students'
        own log-probs are the reference's). Chunks of questions (``tree_chunks``) hold at most
        ``micro_batch_size`` rollouts; each loss is divided by a whole-batch constant, so the accumulated
        gradient is the full batch's. Per student: its metrics, skip flag, pg loss, KL and timings."""
        scfg = self.cfg.student
        n, Q, device = scfg.group_size, scfg.questions_per_step, next(iter(stack.params.values())).device
        stop_ids = stop_token_ids(self.tokenizer, self.baseline)
        sampling = SamplingParams(n=n, temperature=scfg.temperature, max_tokens=scfg.max_tokens, stop=tuple(scfg.stop))
        uniforms = torch.stack([sampling_uniforms(seed, Q * n, scfg.max_tokens) for seed in seeds]).to(device)
        prompt_ids, prompt_mask = self._prompts(batches, device)
        params = self._select(stack.params, active, copies)
        t0 = time.perf_counter()
        rows = stack.sample(params, prompt_ids, prompt_mask, n, scfg.max_tokens, stop_ids, uniforms,
                            scfg.temperature).tolist()
        samples = [[[finish_sample(rows[a][q * n + i], stop_ids, sampling, self.tokenizer) for i in range(n)]
                    for q in range(Q)] for a in range(len(active))]
        t1 = time.perf_counter()
        graded = [grade_rollouts(self.grader, batch, student, scfg.reward) for batch, student in zip(batches, samples)]
        t2 = time.perf_counter()
        out = [{"samples": student, "skipped": scfg.skip_zero_adv and bool((adv_QG == 0).all()), "pg_loss": 0.0,
                "kl_sum": 0.0, "sample_s": t1 - t0, "grade_s": t2 - t1,
                "tokens": sum(len(smp.token_ids) for group in student for smp in group)}
               for student, (_, _, _, adv_QG) in zip(samples, graded)]
        normalisers = [float(Q * n if scfg.loss_norm == "sequence" else max(o["tokens"], 1)) for o in out]
        completions = [[[smp.token_ids for smp in group] for group in student] for student in samples]
        adv_SQn = torch.stack([adv_QG for _, _, _, adv_QG in graded])
        for chunk in tree_chunks(completions, scfg.micro_batch_size // n, self.tree_chunks):  # (S, c) batch positions
            index = torch.tensor(chunk)
            tree = CompletionTree.build([[student[q] for q in qs] for student, qs in zip(completions, chunk)],
                                        self.tokenizer.pad_token_id).to(device)
            gather = index.to(device)[..., None].expand(-1, -1, prompt_ids.shape[-1])
            prompts = stack.prefill(params, prompt_ids.gather(1, gather), prompt_mask.gather(1, gather))
            logp = stack.tree_logprobs(params, prompts, tree, scfg.temperature)
            if scorer is None:
                ref = logp.detach()
            else:
                ref_params, ref_prompts = scorer
                dataset_index = torch.tensor([[pick[q] for q in qs] for pick, qs in zip(picks, chunk)], device=device)
                with torch.no_grad():
                    ref = stack.tree_logprobs(ref_params, ref_prompts.select(dataset_index), tree, scfg.temperature)
            pg_weight, kl_weight = tree.weights(adv_SQn.gather(1, index[..., None].expand(-1, -1, n)))
            total = 0.0
            for a, o in enumerate(out):
                loss, pg, kl_sum = weighted_rloo_loss(logp[a], ref[a] if scfg.kl_coef > 0 else None, pg_weight[a],
                                                      kl_weight[a], scfg.kl_coef, normalisers[a])
                if not torch.isfinite(loss):
                    raise FloatingPointError(non_finite_loss("student", step, scfg.lr, f" (stacked student {active[a]})"))
                total = total + loss
                o["pg_loss"] += pg.item()
                o["kl_sum"] += kl_sum.item()
            total.backward()
        for o, (grades, rewards_QG, correct_QG, adv_QG) in zip(out, graded):
            o["metrics"] = rollout_metrics(o["samples"], grades, rewards_QG, correct_QG, adv_QG)
            o["pg_loss"], o["kl"] = (0.0, 0.0) if o["skipped"] else (o["pg_loss"], o["kl_sum"] / max(o["tokens"], 1))
        return out

    def score_baseline(self, model, problems, metric: str, seed: int) -> list[float]:
        """``model``'s score per problem in ``metric`` (``problem_scores``'s units, seeded ``seed`` when
        sampled) in the stacked students' layout: a one-copy stack computes exactly what each copy of a
        larger one does, so a student that did not move scores exactly as its baseline."""
        return self._score(StackedLlama(model, 1), [seed], problems, metric, stop_token_ids(self.tokenizer, model))[0]

    def _score(self, stack, eval_seeds, problems, metric: str, stop_ids) -> list[list[float]]:
        """Each copy's score per problem in ``metric`` (``problem_scores``'s units; sampled accuracy drawn
        with ``eval_seeds``)."""
        cfg, scfg, S = self.cfg, self.cfg.student, stack.copies
        device = next(iter(stack.params.values())).device
        prompts = encode_prompts(self.tokenizer, [render_prompt(self.template, p.question) for p in problems])
        prompt_ids, prompt_mask = pad_left(prompts, self.tokenizer.pad_token_id)
        prompt_ids = prompt_ids[None].expand(S, -1, -1).to(device)
        prompt_mask = prompt_mask[None].expand(S, -1, -1).to(device)

        @torch.no_grad()
        def gold_logprobs_SM():
            gold, mask = pad_right(gold_completion_ids(self.tokenizer, problems, cfg.inner.gold_completion),
                                   self.tokenizer.pad_token_id)
            gold = gold[None, :, None].expand(S, -1, -1, -1).to(device)
            logp = stack.completion_logprobs(stack.params, stack.prefill(stack.params, prompt_ids, prompt_mask), gold, 1.0)
            return (logp[:, :, 0] * mask.to(device)).sum(-1)

        def correctness_SM():
            samples, max_tokens = cfg.inner.accuracy_samples, scfg.eval_max_tokens or scfg.max_tokens
            n = max(samples, 1)
            with torch.no_grad():
                uniforms = None if samples == 0 else torch.stack(
                    [sampling_uniforms(seed, len(problems) * n, max_tokens) for seed in eval_seeds]).to(device)
                tokens = stack.sample(stack.params, prompt_ids, prompt_mask, n, max_tokens, stop_ids, uniforms).tolist()
            params = SamplingParams(n=n, greedy=samples == 0, max_tokens=max_tokens, stop=tuple(scfg.stop))
            return [grade_correctness(self.grader, problems,
                                      [[finish_sample(tokens[s][q * n + i], stop_ids, params, self.tokenizer)
                                        for i in range(n)] for q in range(len(problems))]) for s in range(S)]

        return score(metric, Measures(correctness_SM, gold_logprobs_SM))

    def close(self) -> None:
        self.baseline = None
