"""Teacher prompt and output format. The paper's prompt (§2) is verbatim, including its
``<question>`` closing-tag typo in the instructions; the parser accepts both closers."""

from __future__ import annotations

from dataclasses import dataclass

PAPER_TEACHER_PROMPT = (
    "You are generating a new math problem for a math assistant.\n"
    "Allowed topics: Algebra, Counting and Probability, Geometry, Intermediate Algebra, Number Theory, "
    "Prealgebra, or Precalculus.\n"
    "Output rules (follow EXACTLY):\n"
    "- Provide the final formatted problem in this structure: <question>[full math question]<question>"
    "<answer>\\boxed{[answer]}</answer>\n"
    "- Any explanations, steps, or reasoning about the problem goes OUTSIDE the <question> and <answer> tags.\n"
    "Constraints:\n"
    "- The problem must be original, challenging, and require at least 2--3 steps of reasoning.\n"
    "- Output exactly ONE problem. You MUST follow the specified format EXACTLY.\n"
    "Begin now:\n"
)


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
