"""The leak check: does a coach's text (advice, a critique, a score's reasoning) carry the gold answer?

A coach that sees the reference answer, or guesses it, can hand it to the policy; then distillation or a
team's reviser learns to copy, not to solve. Every coach runs its output through ``leaks`` and counts
what it drops. Pure functions, no model: the tests pin them by hand.

Both texts are put in one form first (``canonical``): ``\\text{X}``-style wrappers unwrapped, ``$``,
``\\left``/``\\right`` and LaTeX spacing dropped, lower case, runs of whitespace one space, no space
around ``= + - * / ^ ( ) , :``. Then:

- an answer of at least ``min_chars`` characters leaks where it appears as a whole token: not inside a
  longer number or word (``12`` is not in ``123`` nor in ``1.25``, ``max`` is not in ``maximum``);
- a shorter answer (``3``, ``-1``: strings that turn up in any critique, "step 3") leaks only where the
  text states it as an answer: ``\\boxed{3}``, ``final:3``, ``answer is 3``, ``answer:3``, or ``=3`` ending
  the text.
"""

from __future__ import annotations

import re

from soar.grading import _LEFT_RIGHT, _SPACING, _TEXT_WRAP

MIN_CHARS = 3
"""Answers at least this long are searched for anywhere in the text; shorter ones only where stated as an
answer (a 1- or 2-character string is in most critiques by chance)."""

_STATED = (r"\\boxed\{{{a}\}}", r"final:{a}(?![0-9a-z]|\.[0-9])", r"answer is {a}(?![0-9a-z]|\.[0-9])",
           r"answer:{a}(?![0-9a-z]|\.[0-9])", r"={a}\.?$")


def canonical(s: str) -> str:
    """``s`` in the form both texts are compared in (module docstring)."""
    s, prev = s or "", None
    while prev != s:  # unwrap nested \text{...} from the inside out
        prev, s = s, _TEXT_WRAP.sub(r"\1", s)
    s = _SPACING.sub(" ", _LEFT_RIGHT.sub("", s)).replace("\\$", "").replace("$", "").lower()
    s = re.sub(r"\s+", " ", s).strip()
    return re.sub(r" ?([=+\-*/^(),:]) ?", r"\1", s)


def leaks(text: str, answer: str, min_chars: int = MIN_CHARS) -> bool:
    """Whether ``text`` carries ``answer`` (the rule in the module docstring). An empty answer never leaks."""
    a, t = canonical(answer).rstrip("."), canonical(text)
    if not a:
        return False
    esc = re.escape(a)
    if len(a) >= min_chars:
        return re.search(rf"(?<![0-9a-z.]){esc}(?![0-9a-z]|\.[0-9])", t) is not None
    return any(re.search(p.format(a=esc), t) for p in _STATED)
