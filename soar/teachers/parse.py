"""Parse a teacher completion into a (question, answer) pair or a typed rejection (paper §2):
kept only with opening and closing question/answer tags, a ``\\boxed{}`` answer, and boxed
content the grader can parse. First pair wins; empty parts are rejected; text outside the tags
(before, between or after them) is ignored.

Untrusted model text, so also rejected: a question holding an answer tag (it would hand the
student the answer), an answer span with unbalanced braces (``\\boxed{5}}``: the box the model
closed is not the one it meant), and control characters or lone surrogates (NUL, ``\\ud800``:
they break tokenizers, JSON consumers and parquet). The paper's prompt closes the question with
``<question>``, so ``<question>A<question>B</question>`` is the question ``A``; the rest is
text between the tags."""

from __future__ import annotations

import re
from dataclasses import dataclass

from soar.grading import extract_boxed
from soar.teachers.prompts import TeacherFormat

REJECT_REASONS = ("no_tags", "empty_question", "bad_characters", "answer_in_question", "no_box",
                  "unbalanced_braces", "unparseable_answer", "question_too_long")
BAD_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")  # C0 controls but \t \n \r; DEL; surrogates
_BRACE = re.compile(r"(?<!\\)(?:\\\\)*([{}])")  # an unescaped brace (``\{`` is text, ``\\{`` is structure)


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
    """``answer_ok(answer) -> bool`` checks the boxed content is parseable (e.g. by the grader); an
    answer it raises on counts as unparseable."""
    q, a = re.escape(fmt.question_tag), re.escape(fmt.answer_tag)
    # The paper's prompt prints the question closer as <question>; accept it and </question>.
    # Reasoning goes outside the tags (the paper's rule), so text may sit between question and answer.
    m = re.search(rf"<{q}>((?:(?!</?{q}>).)*?)</?{q}>(?:(?!<{q}>).)*?<{a}>(.*?)</{a}>", text, flags=re.S)
    if m is None:
        return Reject("no_tags")
    question, answer_span = m.group(1).strip(), m.group(2)
    if not question:
        return Reject("empty_question")
    if BAD_CHARACTERS.search(question) or BAD_CHARACTERS.search(answer_span):
        return Reject("bad_characters")
    if re.search(rf"</?{a}>", question):
        return Reject("answer_in_question")
    answer = extract_boxed(answer_span)
    if answer is None or not answer.strip():
        return Reject("no_box")
    braces = _BRACE.findall(answer_span)
    if braces.count("{") != braces.count("}"):
        return Reject("unbalanced_braces")
    if answer_ok is not None and not _accepts(answer_ok, answer.strip()):
        return Reject("unparseable_answer")
    if max_question_chars is not None and len(question) > max_question_chars:
        return Reject("question_too_long")
    return Pair(question, answer.strip())


def _accepts(answer_ok, answer: str) -> bool:
    try:
        return bool(answer_ok(answer))
    except Exception:  # a grader's parser failing on model text (e.g. a 5,000-digit integer) is a no
        return False
