"""The coach role of coach-guided on-policy context distillation (``distill.*``, issue 53 B): for each of
the policy's rollouts a coach reads the question, the rollout and its grade, never the reference answer
(unless ``distill.coach_sees_reference``, the oracle upper bound), and writes short, transferable advice;
the advice-conditioned teacher prompt (``distill.advice_template``) is what the distillation teacher scores
the rollout under (``soar.policy.trainer.RLOOTrainer``).

Two coaches:

- ``LLMCoach`` (``distill.coach=llm``): any HF causal LM (``distill.coach_model``, default the policy's
  model) generating from ``distill.coach_prompt`` through the coach role's backend (``backend.coach``: hf
  or vllm). Its completion is untrusted model text, parsed like the teacher's (``parse_advice``): the advice
  tag opened and closed, no control characters or lone surrogates (the teacher parser's rule), not empty,
  at most ``distill.max_advice_chars``.
- ``WorldCoach`` (``distill.coach=world``): the configured world's programmatic coach (``WORLD_COACHES``, by
  world name), computed from the question (and the attempt, where the coach reads it) with
  ``distill.coach_noise``. In the embedded world it computes the question's carry positions from its addends
  and writes them as advice: a stand-in for an LLM coach, not one.

``Advisor`` ties a coach to the trainer: every advice that carries the gold answer (``soar.leak.leaks``) is
refused, like any other rejected text (that rollout is not distilled, ``coach/reject/<reason>`` counts it),
and each step's advice goes to ``advice/step_N.jsonl``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from soar.config import ConfigError
from soar.data import UNSAFE_CHARACTERS
from soar.generation import make_generator
from soar.leak import leaks
from soar.models import load_model, load_tokenizer
from soar.resolve import resolve_backend
from soar.samples import SamplingParams
from soar.seeding import derive_seed
from soar.teachers.parse import Reject
from soar.worlds.arith import carry_advice
from soar.worlds.base import configured_world

ADVICE_REJECT_REASONS = ("no_tags", "empty", "bad_characters", "too_long", "no_advice", "leak")
"""Why a coach's text is not used (``coach/reject/<reason>``); ``no_advice``: a programmatic coach had
none for the question (not one of its world's); ``leak``: the advice carries the gold answer
(``soar.leak.leaks``)."""


@dataclass(frozen=True)
class Advice:
    text: str


def check_advice(text: str, max_chars: int) -> Advice | Reject:
    """Advice text (already out of its tags) that passes the teacher parser's character rule, is not
    empty and has at most ``max_chars`` characters."""
    text = text.strip()
    if not text:
        return Reject("empty")
    if UNSAFE_CHARACTERS.search(text):
        return Reject("bad_characters")
    if len(text) > max_chars:
        return Reject("too_long")
    return Advice(text)


def parse_advice(text: str, tag: str | None = "advice", max_chars: int = 400) -> Advice | Reject:
    """A coach completion -> the advice between the first ``<tag>`` and the next ``</tag>`` (text
    outside is ignored, as the teacher parser ignores text outside its tags; ``tag`` None: the whole
    completion), or a typed rejection."""
    if tag is None:
        return check_advice(text, max_chars)
    t = re.escape(tag)
    m = re.search(rf"<{t}>(.*?)</{t}>", text, flags=re.S)
    if m is None:
        return Reject("no_tags")
    return check_advice(m.group(1), max_chars)


def fill_slots(template: str, **slots: str) -> str:
    """``template`` with each ``{name}`` of ``slots`` filled in one pass (not ``str.format``: prompts hold
    literal braces such as ``\\boxed{}``, and a filled-in text is never searched for slots again)."""
    return re.sub(r"\{(" + "|".join(map(re.escape, slots)) + r")\}", lambda m: slots[m.group(1)], template)


def grade_word(grade) -> str:
    """The coach prompt's ``{grade}``: ``correct`` / ``incorrect``, or ``not attempted`` (None: the coach
    advises before an attempt, ``distill.objective=sft``)."""
    return "not attempted" if grade is None else "correct" if grade.correct else "incorrect"


class LLMCoach:
    """A causal LM writing advice from ``distill.coach_prompt``; one completion per rollout, sampled at
    ``distill.coach_temperature`` with a seed derived from the run seed and the step. The prompt's
    ``{reference}`` slot is filled only for the oracle (``distill.coach_sees_reference``)."""

    def __init__(self, cfg, model, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        engine_path = cfg.distill.coach_model.path or cfg.model.path
        self.generator = make_generator(cfg, "coach", model, tokenizer, pristine=True, engine_path=engine_path)

    def advise(self, questions: list[str], responses: list[str], grades, references: list[str], step: int
               ) -> list[tuple[str, Advice | Reject]]:
        d = self.cfg.distill
        prompts = [fill_slots(d.coach_prompt, question=q, response=r, grade=grade_word(g),
                              **({"reference": a} if d.coach_sees_reference else {}))
                   for q, r, g, a in zip(questions, responses, grades, references)]
        params = SamplingParams(n=1, greedy=d.coach_temperature == 0, temperature=d.coach_temperature or 1.0,
                                max_tokens=d.coach_max_tokens, seed=derive_seed(self.cfg.seed, "coach", step))
        outs = self.generator.generate(prompts, params)
        return [(o[0].text, parse_advice(o[0].text, d.advice_tag, d.max_advice_chars)) for o in outs]


def arith_carry_coach(question: str, attempt: str, noise: float, rng: np.random.Generator) -> str | None:
    """The arithmetic world's coach: the carry plan of ``question`` (``soar.worlds.arith.carry_advice``). The
    attempt is not read: the plan is the help the teacher role reads whatever the student wrote."""
    return carry_advice(question, noise, rng)


WORLD_COACHES: dict[str, Callable[[str, str, float, np.random.Generator], str | None]] = {
    "arith": arith_carry_coach,
}
"""``distill.coach: world``: world name -> its programmatic coach, ``(question, attempt, noise, rng) -> advice``
(None: none for that question), computed from the question and (if the coach reads it) the student's
``attempt``, never the reference answer; ``noise`` in [0, 1] (``distill.coach_noise``) makes it that wrong,
drawing from ``rng``. A stand-in for an LLM coach; a world without one here has none."""


class WorldCoach:
    """The configured world's programmatic coach (``WORLD_COACHES``): a stand-in for an LLM coach, reading
    the question and the attempt, never the reference; its ``distill.coach_noise`` draws come from the run
    seed and the step."""

    def __init__(self, cfg):
        name = configured_world(cfg).name
        if name not in WORLD_COACHES:
            raise ConfigError(f"config error: distill.coach: world {name!r} has no programmatic coach "
                              "(soar.coach.WORLD_COACHES); use distill.coach=llm")
        self.cfg, self.coach = cfg, WORLD_COACHES[name]

    def advise(self, questions, responses, grades, references, step) -> list[tuple[str, Advice | Reject]]:
        d = self.cfg.distill
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "coach", step))
        out = []
        for q, r in zip(questions, responses):
            text = self.coach(q, r, d.coach_noise, rng)
            out.append(("" if text is None else text,
                        Reject("no_advice") if text is None else check_advice(text, d.max_advice_chars)))
        return out


def make_coach(cfg):
    """The coach ``distill.coach`` names (an LLM coach's model: ``distill.coach_model``, else ``model``). On
    ``backend.coach=vllm`` the engine serves the coach from its own copy of the checkpoint: no HF weights
    are loaded (a 70B coach would not fit the policy's GPU)."""
    if cfg.distill.coach == "world":
        return WorldCoach(cfg)
    model_cfg = cfg.distill.coach_model if cfg.distill.coach_model.path else cfg.model
    model = None
    if resolve_backend(cfg.backend, "coach") == "hf":
        model = load_model(model_cfg)
        model.eval().requires_grad_(False)
    return LLMCoach(cfg, model, load_tokenizer(model_cfg))


class Advisor:
    """The trainer's ``advisor``: per rollout, the coach's advice and the teacher prompt it conditions
    (``distill.advice_template``), its metrics (``coach/*``), and the step's advice dump. Advice that carries
    the gold answer is refused (``leak``)."""

    def __init__(self, cfg, coach, out_dir: Path | None):
        self.cfg, self.coach, self.out_dir = cfg, coach, out_dir

    def __call__(self, problems, prompts, samples_QG, grades, step: int) -> tuple[list[str | None], dict]:
        """Advice on each rollout (``samples_QG``, graded ``grades``): one teacher prompt (or None) per rollout."""
        rollouts = [(q, s.text) for q, grp in enumerate(samples_QG) for s in grp]
        return self.advise(problems, prompts, rollouts, grades, step)

    def before_attempts(self, problems, prompts, step: int) -> tuple[list[str | None], dict]:
        """Advice on each question before any attempt (``distill.objective=sft``: the coach reads an empty
        response, grade ``not attempted``): one teacher prompt (or None) per question."""
        return self.advise(problems, prompts, [(q, "") for q in range(len(problems))], [None] * len(problems), step)

    def advise(self, problems, prompts, rollouts: list[tuple[int, str]], grades, step: int
               ) -> tuple[list[str | None], dict]:
        d = self.cfg.distill
        golds = [problems[q].answer for q, _ in rollouts]
        advice = self.coach.advise([problems[q].question for q, _ in rollouts], [text for _, text in rollouts],
                                   grades, golds, step)
        advice = [(raw, Reject("leak") if isinstance(a, Advice) and leaks(a.text, gold) else a)
                  for (raw, a), gold in zip(advice, golds)]
        teacher_texts = [fill_slots(d.advice_template, advice=a.text, prompt=prompts[q]) if isinstance(a, Advice) else None
                         for (q, _), (_, a) in zip(rollouts, advice)]
        rejected = [a.reason for _, a in advice if isinstance(a, Reject)]
        metrics = {"coach/valid_frac": 1 - len(rejected) / max(len(advice), 1),
                   **{f"coach/reject/{r}": rejected.count(r) for r in ADVICE_REJECT_REASONS if r in rejected}}
        if self.out_dir is not None and d.dump_every and (step + 1) % d.dump_every == 0:
            self.dump(step + 1, problems, rollouts, grades, advice)
        return teacher_texts, metrics

    def dump(self, step: int, problems, rollouts, grades, advice) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        rows = [{"question": problems[q].question, "gold": problems[q].answer, "completion": text,
                 "correct": None if g is None else bool(g.correct), "coach_text": raw,
                 **({"advice": a.text} if isinstance(a, Advice) else {"rejected": a.reason})}
                for (q, text), g, (raw, a) in zip(rollouts, grades, advice)]
        path = self.out_dir / f"step_{step:06d}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.replace(path)  # a resumed step rewrites its dump whole
