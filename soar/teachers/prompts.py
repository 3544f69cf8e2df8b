"""Teacher prompt and output format. The paper's prompt (§2) is verbatim, including its
``<question>`` closing-tag typo in the instructions; the parser accepts both closers."""

from __future__ import annotations

from dataclasses import dataclass

from soar.default_prompts import PAPER_TEACHER_PROMPT  # the config default; re-exported here


@dataclass(frozen=True)
class TeacherFormat:
    question_tag: str = "question"
    """Tag name around the question (``<question>…</question>``)."""
    answer_tag: str = "answer"
    """Tag name around the boxed answer (``<answer>\\boxed{…}</answer>``)."""


def format_pair(question: str, answer: str, fmt: TeacherFormat = TeacherFormat()) -> str:
    """The well-formed teacher completion for a (question, answer) pair."""
    q, a = fmt.question_tag, fmt.answer_tag
    return f"<{q}>{question}</{q}><{a}>\\boxed{{{answer}}}</{a}>"


__all__ = ["PAPER_TEACHER_PROMPT", "TeacherFormat", "format_pair"]
