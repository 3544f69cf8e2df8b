"""Stacked students (``resources.batched``: ``soar.students.stacked`` on ``soar.stacked_llama``): the same
math as ``transformers``' Llama, the same samples as the hf backend, and the same students as training
them one by one.

Stated tolerance: the stacked path reorders float32 sums (batched products, shared prompts, prefix
trees). A student's Q_R score agrees with the one-by-one student's to 1e-5, its losses, KL and gradient
norm to 1e-4 relative, and its weights to 1e-3 of its update in L2 over the weights within 1 % of a step,
with at most 0.1 % of the weights further apart, none by more than AdamW can move a weight in those
steps. (AdamW divides by the gradient's running size, so where a gradient is a near-zero difference of
large terms, rounding moves that weight by a fraction of a step or more: at lr 1e-2, 3 steps, measured
2e-4 in L2 and a few weights up to 13 % of a step apart; tested at lr 1e-3. Its first steps move every
weight by about lr whatever its gradient's size, so one weight whose gradient changed sign under another
CPU's summation order is 2 lr apart, which alone is 2 / sqrt(N) ~ 2.5e-3 of an update of N ~ 660k
weights moved lr each: CI's CPU had one, at 1.5e-3 of the update in L2.) Everything its rollouts decide
(their tokens, rewards, accuracy, lengths, skips) is equal."""

import copy

import pytest
import torch

from conftest import ARITH_TEMPLATE

pytestmark = pytest.mark.timeout(300)

WEIGHT_REL_L2, WEIGHT_STEP_FRAC, WEIGHT_OUTLIERS, SCORE_TOL, LOSS_RTOL = 1e-3, 0.01, 1e-3, 1e-5, 1e-4
# The most an AdamW step of lr moves a weight, in lr, at steps 1 and 2 with betas (0.9, 0.999) and no weight
# decay: |m_hat / sqrt(v_hat)| is 1 at step 1 and, by Cauchy-Schwarz, at most
# sqrt(1 + 0.81 / 0.999) * sqrt(1.999) / 1.9 = 1.0014 at step 2.
ADAM_MAX_MOVE = 1.0014
EXACT_METRICS = ("student/reward_mean", "student/accuracy", "student/boxed_frac", "student/partial_credit_frac",
                 "student/frac_groups_all_wrong", "student/frac_groups_no_signal", "student/adv_abs_mean",
                 "student/completion_tokens_mean", "student/rollouts", "student/overflow_frac",
                 "student/skipped_zero_adv", "student/lr")
CLOSE_METRICS = ("student/pg_loss", "student/kl", "student/grad_norm")


def tiny_llama(vocab: int, seed: int):
    """A random Llama with what the world's model lacks: grouped-query attention, an untied head and
    Llama-3's scaled rotary embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=256, rope_parameters={
                             "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def test_hf_samples_do_not_depend_on_the_batch_they_land_in(tiny_model_dir):
    """A row's samples are a function of the request's seed and the row alone (soar.samples): the same at
    any backend.batch_size, and a request of one prompt gets that prompt's rows of a larger request."""
    from omegaconf import OmegaConf

    from soar.generation import HFGenerator, SamplingParams
    from soar.models import load_model, load_tokenizer

    mc = OmegaConf.create({"path": str(tiny_model_dir), "revision": None, "dtype": "float32",
                           "trust_remote_code": False, "device": "cpu"})
    tok, model = load_tokenizer(mc), load_model(mc)
    prompts = [ARITH_TEMPLATE.format(question=q) for q in ("123+456", "99+1", "5+5", "700+300")]
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=7)
    whole = HFGenerator(model, tok, batch_size=256).generate(prompts, params)
    split = HFGenerator(model, tok, batch_size=2).generate(prompts, params)
    assert [[s.token_ids for s in g] for g in whole] == [[s.token_ids for s in g] for g in split]
    assert len({tuple(s.token_ids) for g in whole for s in g}) > 4  # real samples, not one greedy answer
    assert HFGenerator(model, tok).generate(prompts, SamplingParams(n=3, max_tokens=12, seed=8)) != whole


def test_stacked_llama_is_transformers_llama():
    """Log-probs of given completions (as rows and as prefix trees), greedy decoding and seeded sampling of
    a stacked model equal transformers' on left-padded prompts of several lengths."""
    from soar.generation import InverseCDFDraw
    from soar.policy.rloo import pack_sequences, token_logprobs
    from soar.samples import sampling_uniforms
    from soar.stacked_llama import CompletionTree, StackedLlama
    from soar.students.stacked import pad_left, pad_right

    models = [tiny_llama(50, seed) for seed in (0, 1)]
    stack = StackedLlama(models[0], 2)
    with torch.no_grad():
        for name, p in models[1].named_parameters():
            stack.params[name][1].copy_(p)
    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 50, (length,), generator=g).tolist() for length in (5, 9, 3, 7)]  # S=2 x Q=2
    ids, mask = pad_left(prompts, 0)
    ids, mask = ids.view(2, 2, -1), mask.view(2, 2, -1)
    n, steps = 3, 6
    completions = [[[torch.randint(3, 50, (1 + (q + i) % 5,), generator=g).tolist() for i in range(n)]
                    for q in range(2)] for _ in range(2)]
    completions[0][0][1] = completions[0][0][0][:2] + [4]  # shared prefixes for the tree
    completions[1][1][2] = list(completions[1][1][0])  # a duplicate completion
    flat = [c for s in completions for q in s for c in q]
    rows, rmask = pad_right(flat, 0)
    with torch.no_grad():
        prompts_S = stack.prefill(stack.params, ids, mask)
        as_rows = stack.completion_logprobs(stack.params, prompts_S, rows.view(2, 2, n, -1), 0.7)
        tree = CompletionTree.build(completions, 0)
        as_tree = stack.tree_logprobs(stack.params, prompts_S, tree, 0.7)
    for s, model in enumerate(models):
        for q in range(2):
            p = prompts[s * 2 + q]
            for i, c in enumerate(completions[s][q]):
                packed, attn, cmask = pack_sequences([p], [c], 0)
                ref = token_logprobs(model, packed, attn, 0.7)[0][cmask[0].bool()]
                assert torch.allclose(as_rows[s, q, i, : len(c)], ref, atol=1e-5)
                assert torch.allclose(as_tree[s, q, tree.paths[s][q][i]], ref, atol=1e-5)
    greedy = stack.sample(stack.params, ids, mask, 1, steps, [2])
    u = torch.stack([sampling_uniforms(seed, 2 * n, steps) for seed in (11, 12)])
    drawn = stack.sample(stack.params, ids, mask, n, steps, [2], u, 0.7)
    for s, model in enumerate(models):
        for q in range(2):
            p = torch.tensor([prompts[s * 2 + q]])
            hf = model.generate(p, do_sample=False, max_new_tokens=steps, eos_token_id=[2], pad_token_id=0)
            got = hf[0, p.shape[1]:].tolist()
            assert greedy[s, q, : len(got)].tolist() == got
            draw = InverseCDFDraw(u[s, q * n:(q + 1) * n], 0.7, p.shape[1])
            hf = model.generate(p.expand(n, -1), do_sample=False, max_new_tokens=steps, eos_token_id=[2], pad_token_id=0,
                                logits_processor=[draw])
            for i in range(n):
                got = hf[i, p.shape[1]:].tolist()
                cut = got[: got.index(2) + 1] if 2 in got else got
                assert drawn[s, q * n + i, : len(cut)].tolist() == cut


SOLVED = "SOLVED"


def solved_marker_grader():
    """The integer grader, except that a gold of ``SOLVED`` grades every completion correct: a stub
    score for a dataset the model already solves (every group ties, so ``skip_zero_adv`` skips all
    its steps), fixed by construction rather than by which sums this model happens to solve."""
    from soar.grading import REWARD_CORRECT, Grade, IntegerGrader

    class SolvedMarkerGrader(IntegerGrader):
        def _grade_impl(self, pred_text: str, gold: str):
            if gold == SOLVED:
                return Grade(True, REWARD_CORRECT, True, False), False
            return super()._grade_impl(pred_text, gold)

    return SolvedMarkerGrader()


class Updates(list):
    """Records a progress bar's updates."""

    def update(self, n: int) -> None:
        self.append(n)


@pytest.fixture(scope="module")
def micro(tiny_model_dir):
    import dataclasses

    import soar
    from soar.models import load_model, load_tokenizer
    from soar.worlds.arith import generate_problems

    cfg = soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}"])
    datasets = [generate_problems(3, c, 8, seed=40 + c, prefix=f"d{c}") for c in (0, 1, 2)]
    datasets[0] = [dataclasses.replace(p, answer=SOLVED) for p in datasets[0]]  # solved: its steps are skipped
    qr = generate_problems(3, 3, 8, seed=4, prefix="qr")
    return cfg, load_tokenizer(cfg.model), load_model(cfg.model), solved_marker_grader(), datasets, qr


@pytest.mark.parametrize("overrides", [
    ["inner.reward_metric=gold_prob", "student.kl_coef=0.05"],
    ["inner.reward_metric=accuracy", "inner.accuracy_samples=4", "student.loss_norm=token", "student.micro_batch_size=8"],
    ["inner.reward_metric=accuracy", "student.temperature=0.7"],
], ids=["gold_prob_kl", "sampled_accuracy_chunked", "greedy_accuracy_T0.7"])
def test_stacked_students_are_the_students_trained_one_by_one(micro, overrides):
    """Six students (3 datasets x 2 replicates; one dataset solved already by a stub grade,
    ``solved_marker_grader``, so its students skip every step) trained as one stacked model end where
    each ends trained alone (``train_student``, as the in-process executor runs it): the same rollouts,
    rewards, skips and metrics, and weights and Q_R scores within the stated tolerance."""
    from omegaconf import OmegaConf

    from soar.students.pool import StudentRunner, StudentTask, make_students
    from soar.students.stacked import StackedStudents

    cfg, tok, base, grader, datasets, qr = micro
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides + ["student.max_steps=2", "student.lr=1e-3"]))
    tasks = [StudentTask(0, 0, k, j, tuple(d), 2) for k, d in enumerate(datasets) for j in range(2)]
    runner = StudentRunner(OmegaConf.merge(cfg, {"resources": {"batched": False}}), tok, grader, ARITH_TEMPLATE)
    alone = [runner.run(base, task, qr) for task in tasks]  # soar.students.trainer.train_student, one by one
    executor = make_students(OmegaConf.merge(cfg, {"resources": {"batched": True}}), tok, grader, ARITH_TEMPLATE)
    assert isinstance(executor, StackedStudents)
    progress = Updates()
    together = executor.run(tasks, base, qr, progress)
    assert progress == [6]  # trained together, counted together: no bar frame shows one student for all six
    named_base = dict(base.named_parameters())
    skipped = trained = 0
    for a, b in zip(alone, together):
        assert len(a.history) == len(b.history) == 2
        for ha, hb in zip(a.history, b.history):
            assert {k: ha[k] for k in EXACT_METRICS} == {k: hb[k] for k in EXACT_METRICS}
            for k in CLOSE_METRICS:
                assert hb[k] == pytest.approx(ha[k], rel=LOSS_RTOL, abs=1e-7), k
            skipped += ha["student/skipped_zero_adv"]
        assert max(abs(x - y) for x, y in zip(a.correct["qr"], b.correct["qr"])) <= SCORE_TOL
        wa, wb = dict(a.trainer.model.named_parameters()), dict(b.trainer.model.named_parameters())
        diff = torch.cat([(wa[k] - wb[k]).flatten() for k in wa])
        update = torch.cat([(wa[k] - named_base[k]).flatten() for k in wa])
        if all(h["student/skipped_zero_adv"] for h in a.history):  # the solved dataset's: never moved, either way
            assert update.abs().max() == 0 and diff.abs().max() == 0
            continue
        assert update.abs().max() > 1e-4  # they did train (AdamW moves a weight about lr a step)
        trained += 1
        apart = diff.abs() > WEIGHT_STEP_FRAC * update.abs().max()  # more than 1 % of a step: rounding amplified
        assert diff[~apart].norm() <= WEIGHT_REL_L2 * update.norm()
        assert apart.float().mean() <= WEIGHT_OUTLIERS
        assert diff.abs().max() <= 2 * ADAM_MAX_MOVE * sum(h["student/lr"] for h in a.history) * (1 + 1e-5)
    assert skipped >= 4  # the solved dataset's 2 students skip both steps (and the stacked path the same steps)
    assert trained >= 1  # weights compared: of 2 x 2 students on 1-2 carry sums, 4 x 4 samples a step, one moved
    # the promoted or dumped student is a model of the baseline's architecture holding that student
    export, stacked = together[3].trainer.export_model(), together[3].trainer
    assert type(export) is type(base)
    assert all(torch.equal(p, stacked.stack.params[name][3]) for name, p in export.named_parameters())


def test_the_run_says_where_its_students_train(tiny_model_dir):
    """The arith presets stack their students; a Ray pool or lockstep takes precedence, and LoRA students
    train one by one (stacked students are full fine-tuning only: float32, or bf16 with fp32 masters)."""
    import soar
    from soar.students.pool import student_executor

    def where(*extra):
        return student_executor(soar.compose(["experiment=arith_micro", f"model.path={tiny_model_dir}", *extra]))

    assert (where(), where("resources.num_workers=1"), where("student.lora.r=8", "resources.lockstep=true"),
            where("student.lora.r=8"), where("model.dtype=bfloat16"), where("resources.batched=false")) == \
        ("batched", "pool", "lockstep", "in_process", "batched", "in_process")
    assert soar.compose(["experiment=arith"]).resources.batched


def test_stacked_students_refuse_models_that_are_not_llamas():
    from transformers import GPT2Config, GPT2LMHeadModel

    from soar.stacked_llama import StackedLlama

    with pytest.raises(ValueError, match="Llama"):
        StackedLlama(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=40)), 2)
    StackedLlama(copy.deepcopy(tiny_llama(40, 0)), 2)


def stacked_update(dtype, precision: str = "mixed", steps: int = 5, lr: float = 1e-5) -> torch.Tensor:
    """Two stacked copies of a tiny Llama whose initial weights are bf16-representable, in ``dtype``,
    trained ``steps`` steps at ``lr`` on fixed rollouts (each copy its own) through the stacked path's
    loss (prefix trees, ``weighted_rloo_loss``) and ``StackedOptimizer``: the total update of the weights
    the students carry on (the fp32 masters under ``mixed``), flattened."""
    from soar.config import StudentConfig
    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.policy.rloo import weighted_rloo_loss
    from soar.stacked_llama import CompletionTree, StackedLlama
    from soar.students.stacked import StackedOptimizer, pad_left

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=64, layers=2, heads=4, max_positions=128, seed=0).to(torch.bfloat16).to(dtype)
    stack = StackedLlama(model, 2)
    cfg = StudentConfig(lr=lr, max_steps=steps, kl_coef=0.001, precision=precision)
    optimizer = StackedOptimizer(stack, cfg)
    gen = torch.Generator().manual_seed(0)
    vocab, n = len(tok), 4
    prompts = [[torch.randint(4, vocab, (8,), generator=gen).tolist() for _ in range(2)] for _ in range(2)]  # (S, Q)
    completions = [[[torch.randint(4, vocab, (12,), generator=gen).tolist() for _ in range(n)] for _ in range(2)]
                   for _ in range(2)]  # (S, Q, n)
    adv = torch.randn(2, 2, n, generator=gen)
    ids, mask = pad_left([p for student in prompts for p in student], tok.pad_token_id)
    ids, mask = ids.view(2, 2, -1), mask.view(2, 2, -1)
    tree = CompletionTree.build(completions, tok.pad_token_id)
    pg_weight, kl_weight = tree.weights(adv)
    start = {name: w.detach().float().clone() for name, w in optimizer.weights.items()}
    with torch.no_grad():
        reference = stack.tree_logprobs(stack.params, stack.prefill(stack.params, ids, mask), tree, 1.0)
    for _ in range(steps):
        logp = stack.tree_logprobs(stack.params, stack.prefill(stack.params, ids, mask), tree, 1.0)
        total = sum(weighted_rloo_loss(logp[a], reference[a], pg_weight[a], kl_weight[a], cfg.kl_coef, 2 * n)[0]
                    for a in range(2))
        total.backward()
        optimizer.step([0, 1], [lr, lr])
    assert {w.dtype for w in optimizer.weights.values()} == {torch.float32 if precision == "mixed" else dtype}
    assert {p.dtype for p in stack.params.values()} == {dtype}
    return torch.cat([(w.detach().float() - start[name]).flatten() for name, w in optimizer.weights.items()])


def test_bf16_stacked_students_move_like_fp32():
    """Stacked students in bf16 train through fp32 masters (``StackedOptimizer``), as ``RLOOTrainer`` does
    (tests/test_precision.py): at lr 1e-5 every weight moves and the update is the fp32 stack's within
    that file's tolerance; stepping the bf16 stack itself (``precision=pure``) loses most of it."""
    from test_precision import UPDATE_TOLERANCE

    full = stacked_update(torch.float32)
    low = stacked_update(torch.bfloat16)
    moved, gap, l1 = (low != 0).float().mean().item(), ((low - full).norm() / full.norm()).item(), \
        (low.abs().sum() / full.abs().sum()).item()
    assert moved >= 0.99 and gap <= UPDATE_TOLERANCE and abs(l1 - 1) <= UPDATE_TOLERANCE, (moved, gap, l1)
    pure = stacked_update(torch.bfloat16, precision="pure")
    assert (pure != 0).float().mean().item() < 0.5 and (pure.abs().sum() / full.abs().sum()).item() < 0.5

