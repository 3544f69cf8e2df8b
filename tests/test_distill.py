"""Coach-guided on-policy context distillation (issue 53 B, 59): the reverse-KL loss against a hand computation
(pure distillation too), the teacher scoring exactly the policy's sampled token ids, the SFT baseline's update,
the coach's parsing and leak check, the world's reference-free coach and its noise, the LLM-coach path on the
rehearsal model, resume after a kill, and a distilled student that learns, the seed as the unit."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import soar
import soar.hydra_config
from soar.coach import Advice, Advisor, WorldCoach, parse_advice
from soar.config import DistillConfig, StudentConfig
from soar.data import Problem, write_jsonl
from soar.default_prompts import COACH_PROMPT, PAPER_STUDENT_TEMPLATE
from soar.generation import HFGenerator
from soar.grading import make_grader
from soar.metrics_log import read_metrics
from soar.models import build_char_tokenizer, build_tiny_llama, load_model, load_tokenizer
from soar.policy.rloo import distill_token_weights, pack_sequences, token_logprobs, weighted_rloo_loss
from soar.policy.trainer import RLOOTrainer
from soar.samples import Sample
from soar.teachers.parse import Reject
from soar.tokens import encode_prompts
from soar.worlds.arith import carry_advice, carry_bits, carry_plan, generate_problems

from conftest import arith_data, kill_at_checkpoint, run_cli, script

pytestmark = pytest.mark.timeout(600)


def char_pair():
    """A tiny char-level Llama (the policy, nudged) and its initial copy (the frozen teacher)."""
    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, hidden=32, layers=2, heads=2, seed=3)
    teacher = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # the policy has moved away from its initial copy
    return tok, model, teacher


def distill_trainer(model, tok, initial, temperature=1.0, **distill):
    s = StudentConfig(group_size=2, kl_coef=0.0, max_grad_norm=None, micro_batch_size=2, lr=1e-3, max_steps=1,
                      temperature=temperature)
    return RLOOTrainer(model, tok, make_grader("integer"), s, "{question}", seed=0, ref_model=initial,
                       distill=DistillConfig(coach="world", **distill))


def unpadded_logprobs(model, prompt, completion, temperature):
    """log p_T of each completion token, from one forward pass over that sequence alone."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp[torch.arange(len(prompt) - 1, len(prompt) - 1 + len(completion)), torch.tensor(completion)]


@pytest.mark.parametrize("stop_token, which, rl_coef", [(True, "frozen", 0.5), (False, "frozen", 0.5),
                                                       (True, "updated", 0.5), (True, "frozen", 0.0)])
def test_distill_loss_matches_hand_computation(stop_token, which, rl_coef):
    """``frozen``: the teacher is the initial copy; ``updated``: the current policy (no gradient through it);
    ``rl_coef`` 0: pure distillation, the advantages weigh nothing."""
    tok, model, initial = char_pair()
    temperature, coef = 0.7, 0.8
    trainer = distill_trainer(model, tok, initial, temperature, coef=coef, rl_coef=rl_coef, stop_token=stop_token,
                              teacher=which)
    teacher = initial if which == "frozen" else model
    ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    prompts = [ids("12+34="), ids("5+6="), ids("7+8=")]
    completions = [ids("46") + [tok.eos_token_id], ids("11x"), ids("15") + [tok.eos_token_id]]
    teachers = [ids("hint: carry\n12+34="), None, ids("no carry!7+8=")]  # the middle rollout has no advice
    adv = torch.tensor([1.5, -0.5, -1.0])

    stats = trainer.accumulate_gradients(prompts, completions, adv, None, teachers)  # micro-batches of 2
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    loss, diffs = 0.0, []
    for p, c, t, a in zip(prompts, completions, teachers, adv):
        lp = unpadded_logprobs(model, p, c, temperature)
        loss = loss - rl_coef * a * lp.sum()
        if t is not None:
            with torch.no_grad():
                tlp = unpadded_logprobs(teacher, t, c, temperature)
            scored = torch.ones(len(c))
            if not stop_token and c[-1] == tok.eos_token_id:
                scored[-1] = 0.0
            diff = (lp.detach() - tlp) * scored  # log pi(x_t) - log pi_T(x_t | advice): reverse KL per token
            loss = loss + coef * (diff * lp).sum()
            diffs += diff[scored.bool()].tolist()
    (loss / len(prompts)).backward()  # loss_norm=sequence: divided by the number of rollouts
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-6, rtol=1e-4), n
    assert stats["distill_kl"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-5)
    assert stats["advised_frac"] == pytest.approx(2 / 3)
    assert abs(sum(diffs)) > 1e-3  # the teacher differs from the policy, so the term is not vacuous


def test_distill_gradient_is_the_reverse_kl_gradient_in_expectation():
    """At one position, the π-weighted sum over every possible sampled token of the per-token weights'
    gradient equals the gradient of the exact KL(π || π_teacher) from the full distributions."""
    tok, model, teacher = char_pair()
    prompt, t_prompt = tok("3+4=", add_special_tokens=False).input_ids, tok("hint 3+4=", add_special_tokens=False).input_ids
    vocab = len(tok)
    ids, attn, mask = pack_sequences([prompt] * vocab, [[v] for v in range(vocab)], tok.pad_token_id)
    t_ids, t_attn, _ = pack_sequences([t_prompt] * vocab, [[v] for v in range(vocab)], tok.pad_token_id)
    logp = token_logprobs(model, ids, attn)
    with torch.no_grad():
        t_logp = torch.zeros_like(logp)
        t_logp[:, len(prompt) - 1] = token_logprobs(teacher, t_ids, t_attn)[:, len(t_prompt) - 1]
    pi = logp[:, len(prompt) - 1].detach().exp()  # π(v): each one-token completion's probability
    weights = distill_token_weights(logp, t_logp, mask, 1.0) * pi[:, None]
    loss, _, _ = weighted_rloo_loss(logp, None, weights, mask, 0.0, 1.0)
    loss.backward()
    estimated = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    with torch.no_grad():
        t_logits = teacher(input_ids=torch.tensor([t_prompt])).logits[0, -1]
    log_pi, log_teacher = torch.log_softmax(logits, -1), torch.log_softmax(t_logits, -1)
    (log_pi.exp() * (log_pi - log_teacher)).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(estimated[n], p.grad, atol=1e-6, rtol=1e-4), n


def test_teacher_scores_the_policys_sampled_token_ids(rehearsal_model_dir):
    """A real step on the Llama-3.2 tokenizer: the teacher's forward passes see, per rollout, the
    advice-conditioned prompt with one BOS followed by exactly the rollout's ids (EOS included,
    padding only after them), and its log-probs sit at the policy's completion positions. The rollouts
    are given to ``step`` as a batched sampler hands them (``samples_QG``), built here so that their
    lengths differ and some end on an EOS id, others without one, whatever the model would sample."""
    cfg = soar.compose(["experiment=paper_rehearsal", f"model.path={rehearsal_model_dir}"])
    tok, model = load_tokenizer(cfg.model), load_model(cfg.model)
    teacher = load_model(cfg.model)
    s = StudentConfig(group_size=3, kl_coef=0.0, max_tokens=12, micro_batch_size=4, lr=1e-4, max_steps=2)
    advice_template = "Advice: {advice}\n{prompt}"
    distill = DistillConfig(coach="world", advice_template=advice_template)

    def advisor(problems, prompts, samples_QG, grades, step):
        texts = [advice_template.replace("{advice}", f"check {q}").replace("{prompt}", prompts[q])
                 for q, group in enumerate(samples_QG) for _ in group]
        texts[1] = None  # one rollout without advice
        return texts, {}

    trainer = RLOOTrainer(model, tok, make_grader("math_verify"), s, cfg.data.prompt_template, seed=0,
                          ref_model=teacher, distill=distill, advisor=advisor)
    seen = []
    teacher.model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["input_ids"].clone()),
                                            with_kwargs=True)
    problems = [Problem(id="a", question="What is 2+3?", answer="5"),
                Problem(id="b", question="Compute 7 times 6.", answer="42")]
    prompts, _ = trainer.rollout_request(problems)
    eos = (128009, 128008, 128001)

    def rollout(q: int, g: int) -> Sample:  # the right answer for g < 2, so the advantages are not all zero
        text = " ".join(["so"] * (q * s.group_size + g)) + f" \\boxed{{{problems[q].answer if g < 2 else 0}}}"
        ids = tok.encode(text, add_special_tokens=False)
        stop = g != 1  # each question's second rollout ends without an EOS, as one cut at max_tokens does
        return Sample(text, ids + [eos[g]] if stop else ids, "stop" if stop else "length")

    samples = [[rollout(q, g) for g in range(s.group_size)] for q in range(len(problems))]
    flat = [smp for group in samples for smp in group]
    assert len({len(smp.token_ids) for smp in flat}) > 1 and max(len(f.token_ids) for f in flat) <= s.max_tokens
    result = trainer.step(problems, samples)
    assert result.metrics["distill/advised_frac"] == pytest.approx(5 / 6)

    rows = [r for batch in seen for r in batch.tolist()]
    advised = [i for i in range(len(flat)) if i != 1]
    assert len(rows) == len(advised)  # one teacher row per advised rollout, nothing else
    for row, i in zip(rows, advised):
        q = i // s.group_size
        t_prompt = encode_prompts(tok, [advice_template.replace("{advice}", f"check {q}")
                                        .replace("{prompt}", prompts[q])])[0]
        assert t_prompt[0] == tok.bos_token_id and t_prompt.count(tok.bos_token_id) == 1
        completion = flat[i].token_ids
        assert row[: len(t_prompt)] == t_prompt
        assert row[len(t_prompt): len(t_prompt) + len(completion)] == completion  # the very ids sampled
        assert all(t == tok.pad_token_id for t in row[len(t_prompt) + len(completion):])
    # a prompt whose text already starts with the BOS string gets no second one
    assert encode_prompts(tok, ["<|begin_of_text|>Advice: x\n" + prompts[0]])[0].count(tok.bos_token_id) == 1

    # the teacher's log-probs at the policy's completion positions are its unpadded ones
    p_ids = encode_prompts(tok, prompts)
    rollout_prompts = [p_ids[i // s.group_size] for i in range(len(flat))]
    t_prompts = [encode_prompts(tok, [advice_template.replace("{advice}", f"check {i // s.group_size}")
                                      .replace("{prompt}", prompts[i // s.group_size])])[0] if i != 1 else None
                 for i in range(len(flat))]
    ids, _, mask = pack_sequences(rollout_prompts, [f.token_ids for f in flat], tok.pad_token_id)
    values, scored = trainer.distill_teacher_logprobs(t_prompts, [f.token_ids for f in flat], rollout_prompts, ids.shape[1])
    assert torch.equal(scored, mask * torch.tensor([float(i != 1) for i in range(len(flat))])[:, None])
    for i in advised:
        with torch.no_grad():
            hand = unpadded_logprobs(teacher, t_prompts[i], flat[i].token_ids, 1.0)
        start = len(rollout_prompts[i]) - 1
        assert torch.allclose(values[i, start: start + len(flat[i].token_ids)], hand, atol=1e-4)


def world_setup(tmp_path):
    """The shipped world model (policy and its frozen copy), its tokenizer, and distill_arith's config."""
    from soar.stage import resolve_model_path

    cfg = soar.compose(["experiment=distill_arith", f"data.path={tmp_path / 'q.jsonl'}"])
    resolve_model_path(cfg)
    return cfg, load_tokenizer(cfg.model), load_model(cfg.model), load_model(cfg.model)


def test_sft_step_is_the_nll_of_the_advised_teachers_correct_samples(tmp_path):
    """distill.objective=sft: the frozen model samples group_size completions per question from its advised
    prompt (the world coach's carry plan), and the one AdamW step moves every weight against the gradient of
    the negative log-likelihood of exactly the correct ones under the plain, unadvised prompt. On the first
    step AdamW's update is -lr * g / (|g| + eps): its sign pins g's."""
    cfg, tok, model, initial = world_setup(tmp_path)
    lr = 1e-4
    s = StudentConfig(group_size=8, kl_coef=0.0, max_tokens=24, micro_batch_size=64, lr=lr, max_steps=1,
                      max_grad_norm=None)  # unclipped: AdamW's first step is then lr in size wherever |g| >> eps
    d = OmegaConf.to_object(cfg.distill)
    d.objective = "sft"
    trainer = RLOOTrainer(model, tok, make_grader("integer"), s, cfg.data.prompt_template, seed=3, ref_model=initial,
                          distill=d, advisor=Advisor(cfg, WorldCoach(cfg), None))
    before = copy.deepcopy(model)
    problems = generate_problems(12, 10, 4, 8, "sft")
    prompts, params = trainer.rollout_request(problems)  # step 0's: to draw the teacher's samples again
    result = trainer.sft_step(problems)

    advised = [d.advice_template.replace("{advice}", carry_advice(p.question)).replace("{prompt}", q)
               for p, q in zip(problems, prompts)]
    samples = HFGenerator(initial, tok).generate(advised, params)
    targets = [(q, smp) for q, group in enumerate(samples) for smp in group
               if make_grader("integer").grade(smp.text, problems[q].answer).correct]
    m = result.metrics
    assert m["sft/samples"] == 32 and m["sft/targets"] == len(targets) > 0, m
    assert m["sft/teacher_accuracy"] == pytest.approx(len(targets) / 32)

    plain = encode_prompts(tok, prompts)
    nll = sum(-unpadded_logprobs(before, plain[q], smp.token_ids, 1.0).sum() for q, smp in targets) / 32
    nll.backward()
    moved = 0
    for (name, p0), p1 in zip(before.named_parameters(), model.parameters()):
        g, delta = p0.grad, (p1 - p0).detach()
        big = g.abs() > 1e-5
        assert torch.equal(torch.sign(delta[big]), -torch.sign(g[big])), name
        assert torch.allclose(delta[big].abs(), torch.full_like(delta[big], lr), rtol=0.02), name
        moved += int(big.sum())
    assert moved > 1000


def test_parse_advice_rules():
    assert parse_advice("thinking... <advice> Carry the one. </advice> done") == Advice("Carry the one.")
    assert parse_advice("<advice>a</advice><advice>b</advice>") == Advice("a")  # the first one wins
    assert parse_advice("no tags here") == Reject("no_tags")
    assert parse_advice("<advice>unclosed") == Reject("no_tags")
    assert parse_advice("<advice>   </advice>") == Reject("empty")
    assert parse_advice("<advice>bad\x00char</advice>") == Reject("bad_characters")
    assert parse_advice("<advice>lone \ud800</advice>") == Reject("bad_characters")
    assert parse_advice("<advice>" + "x" * 41 + "</advice>", max_chars=40) == Reject("too_long")
    assert parse_advice("<hint>ok</hint>", tag="hint") == Advice("ok")
    assert parse_advice(" plain advice ", tag=None) == Advice("plain advice")
    assert parse_advice("\x07", tag=None) == Reject("bad_characters")
    assert parse_advice("<advice>tabs\tand\nnewlines</advice>") == Advice("tabs\tand\nnewlines")


def test_world_coach_reads_the_question_alone():
    """The world's coach computes the carry plan from the question's addends (no reference answer); its advice
    differs between sums whose carries differ; ``noise`` flips each bit with that probability, from the rng."""
    probs = generate_problems(12, 12, 4, 1, "h") + generate_problems(5, 2, 4, 2, "s") + generate_problems(3, 0, 2, 3, "z")
    for p in probs:
        a, b = (int(x[::-1]) for x in p.question.split("+"))
        assert carry_advice(p.question) == carry_plan(a, b, len(p.question.split("+")[0]))
    assert len({carry_advice(p.question) for p in generate_problems(12, 10, 20, 4, "v")}) > 10  # per-problem advice
    assert carry_advice("what is 2+2?") is None and carry_advice("12+345") is None  # not a world question

    q = generate_problems(12, 6, 1, 5, "n")[0].question
    bits = carry_bits(*(int(x[::-1]) for x in q.split("+")), 12)
    assert carry_advice(q, 1.0, np.random.default_rng(0)) == "carries " + "".join(str(1 - b) for b in bits)
    noisy = [carry_advice(q, 0.25, np.random.default_rng(s)) for s in range(200)]
    flips = [sum(x != y for x, y in zip(n[8:], map(str, bits))) for n in noisy]
    assert abs(np.mean(flips) / 12 - 0.25) < 0.03  # binomial(12, 0.25): mean 3, SE of the mean 0.1
    assert noisy[0] == carry_advice(q, 0.25, np.random.default_rng(0))  # the same draws, the same advice


def advisor_setup(tmp_path, coach, sees_reference=False):
    cfg = soar.compose(["experiment=distill_arith", f"data.path={tmp_path / 'q.jsonl'}"])
    cfg.distill.coach_sees_reference = sees_reference
    return Advisor(cfg, coach(cfg) if coach is WorldCoach else coach, tmp_path / "advice")


class GoldCoach:
    """A programmatic coach (written here) whose advice for two of four rollouts is the gold answer itself,
    worded as a tip: what an oracle or a guessing LLM coach could write."""

    def advise(self, questions, responses, grades, references, step):
        return [(t, Advice(t)) for t in (f"the digits are {references[0]}", "carry at each 9",
                                          f"sum: {references[2]}", "add from the left")]


def test_advice_that_carries_the_gold_answer_is_refused_and_counted(tmp_path):
    """Every coach's advice goes through soar.leak: a leaking advice leaves its rollout undistilled, is counted
    in coach/reject/leak and dumped as rejected; the world's own advice never leaks."""
    probs = generate_problems(12, 10, 2, 7, "l")
    prompts = [f"<question>{p.question}</question><answer>" for p in probs]
    samples = [[Sample(text="\\boxed{1}", token_ids=[1], finish_reason="stop") for _ in range(2)] for _ in probs]
    grades = make_grader("integer").grade_batch(["\\boxed{1}"] * 4, [p.answer for p in probs for _ in range(2)])

    advisor = advisor_setup(tmp_path, GoldCoach())
    texts, metrics = advisor(probs, prompts, samples, grades, 0)
    assert [t is None for t in texts] == [True, False, True, False]
    assert metrics["coach/reject/leak"] == 2 and metrics["coach/valid_frac"] == 0.5
    dump = [json.loads(x) for x in (tmp_path / "advice" / "step_000001.jsonl").read_text().splitlines()]
    assert [d.get("rejected") for d in dump] == ["leak", None, "leak", None]

    texts, metrics = advisor_setup(tmp_path, WorldCoach)(probs, prompts, samples, grades, 0)
    assert all(t is not None for t in texts) and metrics == {"coach/valid_frac": 1.0}
    assert texts[0].endswith(carry_advice(probs[0].question) + prompts[0])


def test_default_coach_prompt_has_no_reference():
    assert "{reference}" not in COACH_PROMPT and "reference" not in COACH_PROMPT.lower()
    assert DistillConfig().coach_sees_reference is False


def strip_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def distill_rl_args(model, data, run_dir, steps, extra=()):
    return [script("soar-rl"), f"model={model}", *arith_data(data), f"student.max_steps={steps}",
            "student.questions_per_step=4", "student.group_size=4", "student.max_tokens=16", "student.lr=1e-4",
            "student.save_every=1", "distill.coach=world", "distill.stop_token=false",
            "distill.advice_template='${world.teacher_prompt}{advice}{prompt}'", "run.threads=1",
            "run.progress=false", f"run.dir={run_dir}", *extra]


def test_world_coach_run_logs_advice(tiny_model_dir, rl_questions, tmp_path):
    run_cli(distill_rl_args(tiny_model_dir, rl_questions, tmp_path / "run", steps=2))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["coach/valid_frac"] == 1 and r["distill/advised_frac"] == 1 for r in rows)
    dump = [json.loads(x) for x in (tmp_path / "run" / "advice" / "step_000001.jsonl").read_text().splitlines()]
    assert len(dump) == 16 and all(d["advice"] == carry_advice(d["question"]) for d in dump)
    assert len({d["advice"] for d in dump}) > 1  # 1- and 2-carry sums: the advice differs per problem


@pytest.mark.slow
def test_distill_resume_after_kill_matches_uninterrupted(tiny_model_dir, rl_questions, tmp_path):
    steps = 5
    run_cli(distill_rl_args(tiny_model_dir, rl_questions, tmp_path / "ref", steps))
    reference = strip_time(read_metrics(tmp_path / "ref" / "metrics.jsonl"))

    killed = tmp_path / "killed"
    kill_at_checkpoint(distill_rl_args(tiny_model_dir, rl_questions, killed, steps), killed, 2)
    assert max(r["step"] for r in read_metrics(killed / "metrics.jsonl")) < steps, "killed too late to test resume"

    res = run_cli(distill_rl_args(tiny_model_dir, rl_questions, killed, steps, extra=["run.resume=must"]))
    assert "resumed from" in res.stdout + res.stderr
    assert strip_time(read_metrics(killed / "metrics.jsonl")) == reference
    last = f"step_{steps:06d}.jsonl"
    assert (killed / "advice" / last).read_text() == (tmp_path / "ref" / "advice" / last).read_text()


def test_llm_coach_on_the_rehearsal_model(rehearsal_model_dir, tmp_path):
    """The LLM-coach path end to end: soar-rl on experiment=paper_rehearsal's model, the coach (the same
    model, hf backend) asked inside the paper's student prompt, the one format the rehearsal model
    continues after arbitrary text ("The final answer is: \\boxed{..}."), taken whole as the advice
    (``advice_tag`` null); the tag rules are ``test_parse_advice_rules``'."""
    coach_prompt = PAPER_STUDENT_TEMPLATE.replace(
        "{question}", "Problem: {question} Attempt: {response} ({grade})")
    run_dir = tmp_path / "llm"
    questions = tmp_path / "q.jsonl"
    write_jsonl(questions, [{"id": str(i), "question": f"What is {i} plus {2 * i}?", "answer": str(3 * i)}
                            for i in range(1, 5)])
    cfg = soar.compose(["experiment=paper_rehearsal", f"model.path={rehearsal_model_dir}", "data=custom",
                        f"data.path={questions}",
                        "student.max_steps=2", "student.questions_per_step=2", "student.group_size=2",
                        "distill.coach=llm", "distill.coach_max_tokens=24", "distill.advice_tag=null", "run.progress=false",
                        "run.threads=1", f"run.dir={run_dir}"])
    cfg.distill.coach_prompt = coach_prompt
    summary = soar.train_rl(cfg)
    assert summary["steps"] == 2
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all("coach/valid_frac" in r and "distill/advised_frac" in r for r in rows)
    dump = [json.loads(x) for f in sorted((run_dir / "advice").glob("step_*.jsonl")) for x in f.read_text().splitlines()]
    assert len(dump) == 2 * 2 * 2
    valid = [d for d in dump if "advice" in d]
    assert valid, [d["coach_text"] for d in dump]  # the rehearsal model writes parseable advice
    assert all(d["advice"] in d["coach_text"] for d in valid)
    assert sum(r["distill/advised_frac"] for r in rows) > 0
    rejected = [d["rejected"] for d in dump if "rejected" in d]
    assert sum(r.get(f"coach/reject/{reason}", 0) for r in rows for reason in set(rejected)) == len(rejected)


def test_real_model_preset_composes_and_validates(tmp_path):
    """experiment=distill_math_8b (not run here: no GPU) composes into a valid soar-rl config."""
    data = tmp_path / "hard_train.jsonl"
    write_jsonl(data, [{"id": "1", "question": "What is 1+1?", "answer": "2"}])
    cfg = soar.compose(["experiment=distill_math_8b", f"data.path={data}"])
    soar.validate(cfg, "rl")
    assert (cfg.model.path, cfg.distill.coach, cfg.distill.coach_model.path) == (
        "meta-llama/Llama-3.1-8B-Instruct", "llm", "meta-llama/Llama-3.3-70B-Instruct")
    assert cfg.student.lora.r == 32 and cfg.distill.teacher == "frozen" and cfg.backend.coach == "vllm"
    text = (Path(soar.hydra_config.conf_dir()) / "experiment" / "distill_math_8b.yaml").read_text()
    assert "NOT RUN HERE" in text


@pytest.mark.parametrize("override, field", [
    ("distill.coach=oracle", "distill.coach"), ("distill.teacher=ema", "distill.teacher"),
    ("distill.coach_sees_reference=true", "distill.coach_sees_reference"),  # the world's coach reads no reference
    ("distill.coach=llm", "distill.coach_prompt"),  # with a {reference} slot, set below, but no flag
    ("distill.coach_noise=1.5", "distill.coach_noise"), ("distill.objective=rl", "distill.objective"),
    ("distill.advice_template=nothing", "distill.advice_template"),
    ("distill.max_advice_chars=0", "distill.max_advice_chars"),
    ("distill.rl_coef=-1", "distill.rl_coef")])
def test_bad_distill_config_names_the_field(override, field, tmp_path):
    data = tmp_path / "q.jsonl"
    write_jsonl(data, [{"id": "1", "question": "1+1", "answer": "2"}])
    cfg = soar.compose(["experiment=distill_arith", f"data.path={data}", override])
    if override == "distill.coach=llm":
        cfg.distill.coach_prompt = COACH_PROMPT + "Reference answer: {reference}\n"
    with pytest.raises(soar.ConfigError, match=field.replace(".", r"\.")):
        soar.validate(cfg, "rl")
    if override == "distill.coach=llm":  # the oracle, named as such, is allowed
        cfg.distill.coach_sees_reference = True
        soar.validate(cfg, "rl")


def learning_runs(args_of, seeds, tmp_path, timeout=900) -> dict:
    """Run ``args_of(seed, run_dir)`` for each seed side by side (one thread each); each seed's eval rows."""
    import os
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = {s: tmp_path / f"s{s}" for s in seeds}
    procs = [subprocess.Popen(args_of(s, run), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for s, run in runs.items()]
    for p in procs:
        assert p.wait(timeout=timeout) == 0, p.stderr.read()[-3000:]
    return {s: [r for r in read_metrics(run / "metrics.jsonl") if "eval/accuracy" in r] for s, run in runs.items()}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three runs side by side, each allowed 900 s
def test_distilled_student_gains_on_heldout_sums_over_seeds(tmp_path):
    """Pure distillation (distill.rl_coef=0: no reward at all) from the world coach's reference-free advice
    raises the student's sampled accuracy on held-out sums, the seed as the unit: over seeds 0-2 the mean
    gain is at least 0.05 and no seed ends below where it started. By construction, not by one model's luck:
    the sums carry at 10 of 12 positions, which the shipped student (pretrained on 0-2 carries) solves about
    0.2 % of the time, while its teacher role, given the carry plan, solves most of them; the only way up is
    the teacher's. Each seed trains on its own draw of 32 sums and is scored on 24 others, 8 samples each."""
    def args(seed, run):
        data = tmp_path / f"data_s{seed}"
        data.mkdir()
        write_jsonl(data / "train.jsonl", [p.to_dict() for p in generate_problems(12, 10, 32, 100 + seed, "train")])
        write_jsonl(data / "heldout.jsonl", [p.to_dict() for p in generate_problems(12, 10, 24, 200 + seed, "held")])
        return [script("soar-rl"), "experiment=distill_arith", f"seed={seed}", f"data.path={data / 'train.jsonl'}",
                f"data.eval_path={data / 'heldout.jsonl'}", "distill.rl_coef=0", "student.max_steps=6",
                "rl.eval_samples=8", "distill.dump_every=0", "run.threads=1", "run.progress=false", f"run.dir={run}"]

    evals = learning_runs(args, (0, 1, 2), tmp_path)
    gains = {s: rows[-1]["eval/accuracy"] - rows[0]["eval/accuracy"] for s, rows in evals.items()}
    assert all(rows[0]["step"] == 0 and rows[-1]["step"] == 6 for rows in evals.values())
    assert min(gains.values()) >= 0 and sum(gains.values()) / 3 >= 0.05, gains
