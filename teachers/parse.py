"""Parse a teacher completion into a (question, answer) pair or a typed rejection (paper §2):
kept only with opening and closing question/answer tags, a ``\\boxed{}`` answer, and boxed
content the grader can parse. First pair wins; empty parts are rejected; text outside the tags
(before, between or after them) is ignored."""

from __future__ import annotations

import re
from dataclasses import dataclass

from soar.grading import extract_boxed
from teachers.prompts import TeacherFormat

REJECT_REASONS = ("no_tags", "empty_question", "no_box", "unparseable_answer", "question_too_long")


@dataclass(frozen=True)
class Pair:
    question: str
    answer: str


@dataclass(frozen=True)
class Reject:
    reason: str
    """One of ``REJECT_REASONS`` (logged as ``teacher/reject/<reason>``)."""


def parse_pair(text: str, fmt: TeacherFormat = TeacherFormat(), answer_ok=None,
               max_question_chars: int | None = None) -> Pair | Reject:
    """``answer_ok(answer) -> bool`` checks the boxed content is parseable (e.g. by the grader)."""
    q, a = re.escape(fmt.question_tag), re.escape(fmt.answer_tag)
    # The paper's prompt prints the question closer as <question>; accept it and </question>.
    # Reasoning goes outside the tags (the paper's rule), so text may sit between question and answer.
    m = re.search(rf"<{q}>((?:(?!</?{q}>).)*?)</?{q}>(?:(?!<{q}>).)*?<{a}>(.*?)</{a}>", text, flags=re.S)
    if m is None:
        return Reject("no_tags")
    question, answer_span = m.group(1).strip(), m.group(2)
    if not question:
        return Reject("empty_question")
    answer = extract_boxed(answer_span)
    if answer is None or not answer.strip():
        return Reject("no_box")
    if answer_ok is not None and not answer_ok(answer.strip()):
        return Reject("unparseable_answer")
    if max_question_chars is not None and len(question) > max_question_chars:
        return Reject("question_too_long")
    return Pair(question, answer.strip())
