"""One generation interface for every role (filter, student rollouts, evaluation, teacher).

``Generator.generate(prompts, params)`` returns, per prompt, ``params.n`` ``Sample``s;
``sync_weights(model)`` says which weights to serve next. The ``hf`` backend wraps ``transformers``
``generate`` (batched, KV cache, left padding) around a live model, so a trainer samples from the
weights it is updating without any copy. The ``vllm`` backend (``soar.vllm_backend``) pushes the
weights into a shared engine when they changed. ``make_generator(cfg.backend, role, ...)`` picks
the backend per role (``backend.filter``, ``backend.teacher``, ``backend.student``, ``backend.eval``).
"""

from __future__ import annotations

import numpy as np
import torch

from soar.data import render_prompt
from soar.memory_plan import planned_engine_bytes, process_training_bytes
from soar.resolve import resolve_backend
from soar.samples import Generator, Sample, SamplingParams, draw_tokens, sampling_uniforms
from soar.tokens import encode_prompts, stop_token_ids
from soar.vllm_backend import VLLMGenerator, engine_for, generate_together  # vllm itself is imported on first use


class HFGenerator:
    """Batched ``model.generate`` on a live (possibly peft-wrapped) model."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    def sync_weights(self, model) -> None:
        self.model = model  # generate reads the live weights: nothing to copy

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Sample]]:
        if params.greedy and params.n != 1:
            raise ValueError("greedy decoding with n > 1 would return n identical samples")
        flat = [p for p in prompts for _ in range(params.n)]
        # One draw per (row, token) from the seed alone (soar.samples): a row's samples do not depend on
        # the batch it lands in.
        uniforms = None if params.greedy else sampling_uniforms(params.seed, len(flat), params.max_tokens)
        out: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(flat), self.batch_size):
                rows = slice(start, start + self.batch_size)
                out.extend(self._generate_batch(flat[rows], params, None if uniforms is None else uniforms[rows]))
        finally:
            self.model.train(was_training)
        return [out[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[str], params: SamplingParams, uniforms_RT) -> list[Sample]:
        from transformers import LogitsProcessorList

        tok = self.tokenizer
        tok.padding_side = "left"
        # The ids the trainers score (BOS once, as vLLM's): soar.tokens.encode_prompts, left-padded.
        enc = tok.pad({"input_ids": encode_prompts(tok, prompts)}, return_tensors="pt").to(self.model.device)
        stop_ids = stop_token_ids(tok, self.model)  # EOS and the model's other end-of-sequence ids
        # Sampling is argmax decoding over the seeded draw's one-hot scores (``InverseCDFDraw``).
        draw = [] if uniforms_RT is None else [InverseCDFDraw(uniforms_RT, params.temperature, enc.input_ids.shape[1])]
        res = self.model.generate(
            input_ids=enc.input_ids,
            attention_mask=enc.attention_mask,
            do_sample=False,
            max_new_tokens=params.max_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=stop_ids,
            stop_strings=list(params.stop) or None,
            tokenizer=tok if params.stop else None,
            return_dict_in_generate=True,
            output_logits=params.logprobs,
            logits_processor=LogitsProcessorList(draw),
        )
        gen = res.sequences[:, enc.input_ids.shape[1]:]
        token_lp = None
        if params.logprobs:
            logits = torch.stack(res.logits, dim=1).float()  # (batch, steps, vocab), raw logits
            token_lp = torch.log_softmax(logits, -1).gather(-1, gen[:, : logits.shape[1], None]).squeeze(-1)
        return [finish_sample(gen[i].tolist(), stop_ids, params, tok, None if token_lp is None else token_lp[i])
                for i in range(gen.shape[0])]


class InverseCDFDraw:
    """A ``transformers`` logits processor that turns ``generate``'s greedy step into a draw from
    softmax(scores / T) with each row's own uniform (``soar.samples.draw_tokens``): the drawn token's
    score becomes 0 and every other one -inf, so the argmax is the draw."""

    def __init__(self, uniforms_RT: torch.Tensor, temperature: float, prompt_width: int):
        self.temperature, self.prompt_width = temperature, prompt_width
        self.uniforms_RT = uniforms_RT

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_width
        tokens = draw_tokens(scores, self.uniforms_RT[:, step], self.temperature)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


def finish_sample(ids: list[int], stop_ids: list[int], params: SamplingParams, tok, token_lp=None) -> Sample:
    """A generated row (no prompt) as a ``Sample``: cut to what was sampled (``completion_ids``), decoded,
    cut at a stop string, with its finish reason and, given per-position log-probs, its tokens' ones."""
    ids = completion_ids(ids, stop_ids, params.stop, tok)
    finish = "stop" if ids[-1:] and ids[-1] in stop_ids else "length"
    text = tok.decode(ids, skip_special_tokens=True)
    for s in params.stop:
        if s in text:
            text, finish = text[: text.index(s)], "stop"
    if finish == "length" and len(ids) < params.max_tokens:
        finish = "stop"  # a stop string ended it
    lp = token_lp[: len(ids)].tolist() if token_lp is not None else None
    return Sample(text=text, token_ids=ids, finish_reason=finish, logprobs=lp)


def completion_ids(ids: list[int], stop_ids: list[int], stop: tuple[str, ...], tok) -> list[int]:
    """One row of ``generate``'s output cut to what was sampled: through the first stop id or the
    token that completes the first stop string, whichever comes first, else all of it (a row that
    never stopped ran to ``max_new_tokens``, so it holds no padding). Padding is never kept, even
    when the pad id is an EOS id (Llama-3 without a pad token: pad = EOS), and a sampled pad id is."""
    ends = [ids.index(s) for s in stop_ids if s in ids]
    ids = ids[: min(ends) + 1] if ends else ids
    if stop and any(s in tok.decode(ids, skip_special_tokens=True) for s in stop):
        lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string (monotone in length)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in tok.decode(ids[:mid], skip_special_tokens=True) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        return ids[:lo]
    return ids


def generate_many(requests: list[tuple[Generator, list[str], SamplingParams]]) -> list[list[list[Sample]]]:
    """Many generators' calls at once, each result equal to its own ``generate``: calls on one vLLM
    engine go out together (``soar.vllm_backend.generate_together``: one ``LLM.generate`` with a
    ``LoRARequest`` per adapter), so the engine batches across e.g. all students of a step; other
    generators run one after another."""
    out: list = [None] * len(requests)
    by_engine: dict[int, list[int]] = {}
    for i, (gen, prompts, params) in enumerate(requests):
        if getattr(gen, "engine", None) is None:
            out[i] = gen.generate(prompts, params)
        else:
            by_engine.setdefault(id(gen.engine), []).append(i)
    for idx in by_engine.values():
        for i, res in zip(idx, generate_together([requests[i] for i in idx])):
            out[i] = res
    return out


def make_generator(cfg, role: str, model, tokenizer, pristine: bool = False, engine_path: str | None = None
                   ) -> Generator:
    """The generator of ``role`` serving ``model``'s weights (None: set later with ``sync_weights``).
    ``vllm`` starts (or reuses) the engine of ``engine_path`` (default ``cfg.model.path``, the run's base
    checkpoint: every policy of a run shares its architecture, and their weights are pushed in, unless
    ``pristine`` says ``model`` holds exactly the checkpoint's weights: the engine then serves its own
    copy; e.g. the coach's model, ``distill.coach_model``)."""
    if resolve_backend(cfg.backend, role) == "hf":
        return HFGenerator(model, tokenizer, batch_size=cfg.backend.batch_size)
    path = engine_path or cfg.model.path
    engine = engine_for(path, cfg.backend.vllm, cfg.model.max_context, cfg.seed,
                        training_bytes=lambda: process_training_bytes(cfg),
                        budget_bytes=lambda: planned_engine_bytes(cfg, path))
    return VLLMGenerator(engine, None if pristine else model, tokenizer)


# ---- correctness: what the paper calls Acc -------------------------------------------------------
def correctness(generator, grader, problems, template: str, max_tokens: int, stop=(), samples: int = 0,
                seed: int = 0, temperature: float = 1.0) -> list[float]:
    """Per problem: greedy correctness (``samples`` 0, the paper's Acc) or the fraction of
    ``samples`` samples at ``temperature`` that are correct (a lower-variance alternative)."""
    prompts, params = correctness_request(problems, template, max_tokens, stop, samples, seed, temperature)
    return grade_correctness(grader, problems, generator.generate(prompts, params))


def correctness_request(problems, template: str, max_tokens: int, stop=(), samples: int = 0, seed: int = 0,
                        temperature: float = 1.0) -> tuple[list[str], SamplingParams]:
    """The prompts and sampling parameters ``correctness`` generates with."""
    prompts = [render_prompt(template, p.question) for p in problems]
    return prompts, SamplingParams(n=max(samples, 1), greedy=samples == 0, temperature=temperature,
                                   max_tokens=max_tokens, stop=tuple(stop), seed=seed)


def grade_correctness(grader, problems, outs) -> list[float]:
    grades = grader.grade_batch([s.text for o in outs for s in o], [p.answer for p, o in zip(problems, outs) for _ in o])
    flat = np.array([g.correct for g in grades], dtype=float).reshape(len(problems), -1)
    return flat.mean(-1).tolist()


__all__ = ["Generator", "HFGenerator", "Sample", "SamplingParams", "correctness", "correctness_request",
           "generate_many", "grade_correctness", "make_generator", "resolve_backend"]
