"""What a team's roles write and use: output parsers (``PARSERS``), tools (``TOOLS``) and programmatic process
scorers (``SCORERS``), each a registry a world adds to (``soar.worlds.arith_team_formats`` registers the embedded
world's). Model text is untrusted: a parser never raises on it, it returns ``Parsed(ok=False, reason=...)``.

Built in:

- ``boxed_answer``: a solution whose answer is the last ``\\boxed{}`` or, failing that, the text after the
  last ``FINAL:`` (recipe A's solver); a missing answer is a wrong one (the chain goes on);
- ``critique_json``: recipe A's coach, a JSON object with ``error_type``, ``first_wrong_step`` and ``fix``;
  anything else drops the episode (never a default critique);
- the ``python_sandbox`` tool: runs the last fenced Python block of the roles it reads
  (``soar.team.sandbox``) and shows its output;
- ``ERROR_TYPES``: a world's diagnosis of an attempt, per parser (the fix rate by error type);
- ``parse_score``: the LLM process coach's ``SCORE: n`` (0-10); anything else drops the scored action
  (MAPPA's reference code turns it into 5.0).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

from soar.data import UNSAFE_CHARACTERS
from soar.grading import extract_boxed
from soar.team.sandbox import run_python


@dataclass(frozen=True)
class Parsed:
    ok: bool
    """The output has the role's format."""
    shown: str
    """What later roles read of it (their ``{<role>}`` slot)."""
    answer: str | None = None
    """The answer a graded role gives (None: none found: wrong)."""
    error_type: str | None = None
    """A critique's stated error type (``none`` when it finds no error)."""
    reason: str | None = None
    """Why it did not parse."""


@dataclass(frozen=True)
class Parser:
    fn: Callable[[str], Parsed]
    drops: bool = False
    """An output that does not parse drops its episode (a coach's: never a default critique); otherwise the
    chain goes on with it (a solution without an answer is a wrong one)."""


PARSERS: dict[str, Parser] = {}


def register_parser(name: str, drops: bool = False):
    def wrap(fn):
        PARSERS[name] = Parser(fn, drops)
        return fn
    return wrap


def checked_text(text: str) -> str | None:
    """The reason a text is unusable (control characters, lone surrogates: the teacher parser's rule), or None."""
    return "bad_characters" if UNSAFE_CHARACTERS.search(text or "") else None


@register_parser("boxed_answer")
def boxed_answer(text: str) -> Parsed:
    text = text.strip()
    answer = extract_boxed(text)
    if answer is None:
        finals = re.findall(r"FINAL:\s*(.+)", text)
        answer = finals[-1].strip().rstrip(".").strip("$ ") if finals else None
    if checked_text(text) or not answer:
        return Parsed(False, text, None, reason=checked_text(text) or "no_answer")
    return Parsed(True, text, answer.strip())


CRITIQUE_KEYS = ("error_type", "first_wrong_step", "fix")


@register_parser("critique_json", drops=True)
def critique_json(text: str) -> Parsed:
    """The first ``{...}`` of the text as JSON with ``CRITIQUE_KEYS``; shown to the reviser re-serialised."""
    if checked_text(text):
        return Parsed(False, "", reason="bad_characters")
    m = re.search(r"\{.*\}", text, flags=re.S)
    if m is None:
        return Parsed(False, "", reason="no_json")
    try:
        obj = json.loads(m.group(0))
    except json.JSONDecodeError:
        return Parsed(False, "", reason="bad_json")
    if not isinstance(obj, dict) or any(k not in obj for k in CRITIQUE_KEYS):
        return Parsed(False, "", reason="missing_keys")
    error_type = str(obj["error_type"]).strip().lower() or "none"
    return Parsed(True, json.dumps({k: obj[k] for k in CRITIQUE_KEYS}), error_type=error_type)


# ---- tools ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    cfg: object
    """The run's config (``cfg.team.sandbox``, ``cfg.world``)."""
    question: str
    inputs: dict[str, str]
    """What the tool reads: the shown output of each role of its ``sees``."""
    reference: str | None = None
    """The gold answer, only for a tool with ``oracle: true``."""


@dataclass(frozen=True)
class Tool:
    fn: Callable[[ToolCall], Parsed]
    reads_reference: bool = False
    """An oracle: refused unless its role says ``oracle: true`` (a named upper bound)."""


TOOLS: dict[str, Tool] = {}


def register_tool(name: str, reads_reference: bool = False):
    def wrap(fn):
        TOOLS[name] = Tool(fn, reads_reference)
        return fn
    return wrap


def last_code_block(text: str) -> str | None:
    """The last fenced ```` ```python ```` (or bare ```` ``` ````) block of ``text``."""
    blocks = re.findall(r"```(?:python|py)?[ \t]*\n(.*?)```", text, flags=re.S)
    return blocks[-1] if blocks else None


@register_tool("python_sandbox")
def python_sandbox(call: ToolCall) -> Parsed:
    code = next((c for c in map(last_code_block, reversed(list(call.inputs.values()))) if c is not None), None)
    if code is None:
        return Parsed(False, "no code to run", reason="no_code")
    result = run_python(code, call.cfg.team.sandbox)
    if result.timed_out:
        return Parsed(False, "error: time limit", reason="timeout")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["exit code %s" % result.returncode])[-1]
        return Parsed(False, f"error: {last}", reason="error")
    return Parsed(True, result.stdout.strip())


# ---- programmatic process scorers ------------------------------------------------------------------------
@dataclass(frozen=True)
class ScoreCall:
    cfg: object
    role: str
    parser: str
    """The scored role's output format (what the scorer knows how to judge)."""
    question: str
    output: str
    """The scored role's completion."""
    inputs: dict[str, str]
    """What the scored role read: the shown output of each role of its ``sees``."""
    reference: str | None
    """The gold answer when the role has ``scorer_sees_reference``, else None."""
    prompt: str = ""
    """The scored role's prompt (its input)."""


SCORERS: dict[str, Callable[[ScoreCall], tuple[str, float | None]]] = {}
"""A programmatic scorer: ``(its text, score 0-10 or None when it cannot score)``."""


def register_scorer(name: str):
    def wrap(fn):
        SCORERS[name] = fn
        return fn
    return wrap


ERROR_TYPES: dict[str, Callable[[str, str], str]] = {}
"""Per parser, a world's diagnosis of a first attempt (``question, text -> type``), for the fix rate by error
type; where a parser has none, the critique's stated ``error_type`` is used."""


def register_error_type(parser: str):
    def wrap(fn):
        ERROR_TYPES[parser] = fn
        return fn
    return wrap


def parse_score(text: str) -> float | None:
    """The last ``SCORE: n`` of an LLM coach's text, n in 0-10; None otherwise."""
    found = re.findall(r"SCORE:\s*(-?\d+(?:\.\d+)?)", text or "")
    if not found:
        return None
    score = float(found[-1])
    return score if 0.0 <= score <= 10.0 else None
