"""Teacher side of SOAR: prompt templates and output parsing (paper §2)."""

from soar.teachers.parse import Pair, Reject, parse_pair
from soar.teachers.prompts import PAPER_TEACHER_PROMPT, TeacherFormat, format_pair

__all__ = ["PAPER_TEACHER_PROMPT", "Pair", "Reject", "TeacherFormat", "format_pair", "parse_pair"]
