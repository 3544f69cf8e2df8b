"""Tokenization parity on Llama-3.2's real tokenizer (hf backend; the vLLM side is in
tests/test_rehearsal_vllm.py): the ids every generator conditions on are the ids the trainers score,
with the BOS exactly once; every end-of-sequence id of the model stops a completion; padding (pad =
EOS, or Llama's own pad token) never becomes a trained token."""

from __future__ import annotations

import copy

import pytest
import torch

import soar
from soar.generation import HFGenerator, SamplingParams, completion_ids
from soar.tokens import encode_prompt, encode_prompts, stop_token_ids

pytestmark = pytest.mark.timeout(300)

BOS, END_OF_TEXT, EOM, EOT, PAD = 128000, 128001, 128008, 128009, 128004
QUESTIONS = ["What is 12 + 30?", "Find $x$ if $2x = 10$.", "What is 7 + 8?"]


@pytest.fixture(scope="module")
def llama(rehearsal_model_dir):
    from soar.models import load_model, load_tokenizer

    cfg = soar.compose(["experiment=paper_rehearsal", f"model.path={rehearsal_model_dir}"])
    return cfg, load_tokenizer(cfg.model), load_model(cfg.model)


def prompts(cfg):
    from soar.data import render_prompt

    return [render_prompt(cfg.data.prompt_template, q) for q in QUESTIONS]


def swapped(model, a: int, b: int):
    """``model`` with tokens a and b exchanged (tied embeddings: input and output rows): it ends its
    answers with b where it ended them with a (the EOS it was taught, <|eot_id|>)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        table = out.get_input_embeddings().weight
        table[[a, b]] = table[[b, a]].clone()
    return out


def test_bos_exactly_once(llama):
    cfg, tok, _ = llama
    text = prompts(cfg)[0]
    ids = encode_prompt(tok, text)
    assert ids[0] == BOS and ids.count(BOS) == 1
    assert encode_prompt(tok, tok.bos_token + text) == ids  # e.g. a chat template's output: not twice
    # Suspect 1, confirmed: vLLM tokenises a text prompt with the BOS (add_special_tokens=True), the
    # trainers used to score it without; both now use encode_prompt, which equals the tokenizer's default.
    assert tok(text).input_ids == ids and tok(text, add_special_tokens=False).input_ids == ids[1:]
    from soar.models import build_char_tokenizer

    world = build_char_tokenizer()  # no BOS in the world's encoding: its ids are unchanged
    assert encode_prompt(world, "12+30=") == world("12+30=", add_special_tokens=False).input_ids


def test_stop_ids_are_every_eos_of_the_model(llama):
    _, tok, model = llama
    # Suspect 2, confirmed: generation.py passed only tok.eos_token_id (<|eot_id|>); Llama-3.2-Instruct
    # also ends on <|end_of_text|> and <|eom_id|> (its generation_config), which vLLM stops on.
    assert tok.eos_token_id == EOT and tok.pad_token_id == EOT  # no pad token: load_tokenizer pads with EOS
    assert stop_token_ids(tok, model) == [EOT, END_OF_TEXT, EOM]


def test_completion_ids_never_keep_padding(llama):
    _, tok, _ = llama
    stops = [EOT, END_OF_TEXT, EOM]
    # pad = EOS (<|eot_id|>): a row that ended on <|eom_id|> is padded with EOT; the old cut "at the
    # first tok.eos_token_id" kept one pad as a trained EOS token.
    assert completion_ids([5, 6, EOM, EOT, EOT], stops, (), tok) == [5, 6, EOM]
    assert completion_ids([5, 6, EOT, EOT, EOT], stops, (), tok) == [5, 6, EOT]
    assert completion_ids([5, 6, 7], stops, (), tok) == [5, 6, 7]  # ran to max_tokens: nothing to cut
    # Llama's real pad token sampled mid-completion is a sampled token (the old filter dropped it).
    assert completion_ids([5, PAD, 6], stops, (), tok) == [5, PAD, 6]
    # A stop string ends the row where its text first holds it, before any padding (pad = EOS or not).
    row = tok("The answer is 7. Done", add_special_tokens=False).input_ids
    cut = completion_ids(row + [EOT, EOT], stops, (". Done",), tok)
    assert cut == row and completion_ids(row + [PAD, PAD], stops, (". Done",), tok) == row


@pytest.mark.parametrize("pad", ["eos", "<|finetune_right_pad_id|>"])
def test_hf_conditions_on_the_trainer_ids_and_stops_on_every_eos(llama, pad):
    from soar.policy.rloo import pack_sequences, token_logprobs

    cfg, tok, model = llama
    tok = copy.deepcopy(tok)
    if pad != "eos":
        tok.pad_token = pad
    for eos in (EOM, END_OF_TEXT, EOT):
        policy = model if eos == EOT else swapped(model, EOT, eos)
        seen = []
        original = policy.generate

        def spy(*args, **kwargs):  # the ids generate really conditions on: each row without its padding
            seen.extend(ids[mask.bool()].tolist() for ids, mask in zip(kwargs["input_ids"], kwargs["attention_mask"]))
            return original(*args, **kwargs)

        policy.generate = spy
        texts = prompts(cfg)
        out = HFGenerator(policy, tok).generate(texts, SamplingParams(n=4, max_tokens=24, seed=3, logprobs=True))
        del policy.generate
        assert seen == [ids for ids in encode_prompts(tok, texts) for _ in range(4)]
        samples = [s for group in out for s in group]
        ended = [s for s in samples if s.finish_reason == "stop"]
        assert len(ended) >= len(samples) // 2  # the model was taught to end its answers
        for s in samples:
            stops_in = [t for t in s.token_ids if t in (EOT, END_OF_TEXT, EOM)]
            assert stops_in == ([eos] if s.finish_reason == "stop" else [])  # that EOS, last, and only it
            assert s.token_ids[-1] == eos or s.finish_reason == "length" and len(s.token_ids) == 24
            assert PAD not in s.token_ids or pad == "eos"
        # The trainer's log-probs of those tokens, on its own prompt ids (BOS included), equal the sampler's.
        flat_prompts = [ids for ids in encode_prompts(tok, texts) for _ in range(4)]
        ids, attn, mask = pack_sequences(flat_prompts, [s.token_ids for s in samples], tok.pad_token_id)
        with torch.no_grad():
            scored = token_logprobs(policy, ids, attn)
        for i, s in enumerate(samples):
            start = len(flat_prompts[i]) - 1
            assert torch.allclose(scored[i, start:start + len(s.token_ids)], torch.tensor(s.logprobs), atol=1e-4)
        assert int(mask.sum()) == sum(len(s.token_ids) for s in samples)  # trained tokens: exactly the sampled ones


def test_trainer_rollouts_and_gold_scores_use_the_sampled_ids(llama):
    from soar.data import Problem
    from soar.grading import make_grader
    from soar.policy.rloo import pack_sequences, token_logprobs
    from soar.policy.scores import gold_logprobs
    from soar.policy.trainer import RLOOTrainer

    cfg, tok, model = llama
    problems = [Problem(f"p{i}", q, "42") for i, q in enumerate(QUESTIONS[:2])]
    s_cfg = soar.compose(["experiment=paper_rehearsal", "student.group_size=2", "student.kl_coef=0"]).student
    trainer = RLOOTrainer(copy.deepcopy(model), tok, make_grader("math_verify"), s_cfg, cfg.data.prompt_template, 0)
    got = {}
    trainer.update = lambda prompt_ids, completion_ids, adv, logprobs=None, advised_prompt_ids=None: got.update(
        p=prompt_ids) or {"skipped": True, "lr": 0.0, "pg_loss": 0.0, "kl": 0.0, "grad_norm": 0.0, "forward_backward_s": 0.0,
        "optimizer_s": 0.0}
    trainer.step(problems)
    assert got["p"] == [ids for ids in encode_prompts(tok, prompts(cfg)[:2]) for _ in range(2)]
    assert all(ids[0] == BOS and ids.count(BOS) == 1 for ids in got["p"])
    # Q_R by gold log-probability: p(gold | BOS + prompt), as the students sample.
    gold = [tok("\\boxed{42}", add_special_tokens=False).input_ids] * 2
    ids, attn, mask = pack_sequences(encode_prompts(tok, prompts(cfg)[:2]), gold, tok.pad_token_id)
    with torch.no_grad():
        expected = (token_logprobs(model, ids, attn) * mask).sum(-1).tolist()
    assert gold_logprobs(model, tok, problems, cfg.data.prompt_template, "\\boxed{{answer}}") == pytest.approx(expected)


def test_teacher_samples_and_scores_the_same_prompt_ids(llama):
    from soar.grading import make_grader
    from soar.teachers.update import TeacherPolicy

    cfg, tok, model = llama
    teacher = TeacherPolicy(cfg, copy.deepcopy(model), tok, make_grader("math_verify"), cfg.data.prompt_template, 1024)
    assert teacher.prompt_ids == encode_prompt(tok, cfg.teacher.prompt) and teacher.prompt_ids[0] == BOS
    groups, metrics = teacher.sample(0)
    assert metrics["teacher/valid_frac"] > 0
    rollouts = [r for g in groups for d in g for r in d]
    assert all(r.token_ids[-1] in (EOT, END_OF_TEXT, EOM) or len(r.token_ids) == cfg.teacher.max_tokens for r in rollouts)
