"""The team world's formats for ``soar-team`` (``soar.worlds.arith_team``): registered in the team's registries
(``soar.team.formats``) when imported (``soar.team.checks`` imports it): the parsers ``arith_working``,
``arith_critique``, ``arith_plan``; the tools ``digit_add`` and ``arith_oracle_critique`` (reads the reference:
an upper bound only); the error types of a working and of the tool's sum; and ``arith_stand_in``, a
programmatic process coach of controlled quality (a stand-in for an LLM coach: it scores from the true sum, with
``team.scorer.noise`` and ``bias``).
"""

from __future__ import annotations

import re

from soar.team.formats import (
    Parsed,
    ScoreCall,
    ToolCall,
    register_error_type,
    register_parser,
    register_scorer,
    register_tool,
)
from soar.worlds.arith import lsb, parse_question
from soar.worlds.arith_team import critique, digits_from_carries, digits_of, first_wrong, parse_working, true_working


@register_error_type("arith_working")
def error_type(question: str, attempt: str) -> str:
    """What is wrong with a working: ``none``, ``format``, ``carry`` (a carry bit is) or ``digit`` (only digits)."""
    parsed_q = parse_question(question)
    got = parse_working(attempt)
    if parsed_q is None:
        return "unknown"
    a, b, d = parsed_q
    if got is None or len(got[0]) != d or len(got[1]) != d + 1:
        return "format"
    carries, sums = true_working(a, b, d)
    if got[0] != carries:
        return "carry"
    return "none" if got[1] == sums else "digit"


def digit_add(question: str, plan: str) -> Parsed:
    """The tool: each sum digit from the plan's carries, and a flag where the plan's carry is not the digits'."""
    parsed_q = parse_question(question)
    m = re.fullmatch(r"carries ([01]+)", (plan or "").strip())
    if parsed_q is None or m is None or len(m.group(1)) != parsed_q[2]:
        return Parsed(False, "error", reason="bad_plan")
    a, b, d = parsed_q
    p = [int(c) for c in m.group(1)]
    ad, bd = digits_of(a, d), digits_of(b, d)
    flags = [int((ad[i] + bd[i] + (p[i - 1] if i else 0) >= 10) != p[i]) for i in range(d)]
    s = "".join(map(str, digits_from_carries(a, b, d, p)))
    return Parsed(True, f"sum {s} flags {''.join(map(str, flags))}", answer=s)


@register_parser("arith_working")
def parse_arith_working(text: str) -> Parsed:
    text = (text or "").strip()
    got = parse_working(text)
    return Parsed(True, text, "".join(map(str, got[1]))) if got else Parsed(False, text, reason="no_working")


@register_parser("arith_critique", drops=True)
def parse_arith_critique(text: str) -> Parsed:
    text = (text or "").strip()
    if text == "ok":
        return Parsed(True, "ok", error_type="none")
    if re.fullmatch(r"pos \d{1,2}", text):
        return Parsed(True, text, error_type="pos")
    return Parsed(False, "", reason="not_ok_or_pos")


@register_parser("arith_plan")
def parse_arith_plan(text: str) -> Parsed:
    text = (text or "").strip()
    return Parsed(True, text) if re.fullmatch(r"carries [01]+", text) else Parsed(False, text, reason="no_plan")


@register_error_type("digit_add")
def tool_error_type(question: str, text: str) -> str:
    """What is wrong with the digit-add tool's sum: the plan was malformed (``format``) or its carries were
    wrong (``carry``: the tool adds right given the carries), or nothing (``none``)."""
    parsed_q = parse_question(question)
    if parsed_q is None:
        return "unknown"
    if text == "error":
        return "format"
    a, b, d = parsed_q
    return "none" if text.startswith(f"sum {lsb(a + b, d + 1)} ") else "carry"


@register_tool("digit_add")
def digit_add_tool(call: ToolCall) -> Parsed:
    plan = next(iter(call.inputs.values()), "")
    return digit_add(call.question, plan)


@register_tool("arith_oracle_critique", reads_reference=True)
def oracle_critique_tool(call: ToolCall) -> Parsed:
    """The true critique of the attempt, from the reference: an upper bound on any coach, never a baseline."""
    attempt = next(iter(call.inputs.values()), "")
    text = critique(call.question, attempt)
    return Parsed(True, text, error_type="none" if text == "ok" else "pos")


def leading_right(got: list[int], want: list[int]) -> int:
    n = 0
    for g, w in zip(got, want):
        if g != w:
            break
        n += 1
    return n


@register_scorer("arith_stand_in")
def stand_in_score(call: ScoreCall) -> tuple[str, float | None]:
    """A stand-in for MAPPA's LLM coach, scoring from the true sum: a plan or working by the share of its
    leading positions that are right, a critique (of the first role it read) by whether it is the true one,
    an answer by its leading
    right digits; ``team.scorer.bias`` adds ``10 x bias x`` the share of carries a plan or working claims
    (a coach that likes carries). ``team.scorer.noise`` is applied by the caller, as to any scorer."""
    parsed_q = parse_question(call.question)
    if parsed_q is None:
        return "", None
    a, b, d = parsed_q
    carries, sums = true_working(a, b, d)
    text = (call.output or "").strip()
    claimed: list[int] = []
    if call.parser == "arith_plan":
        m = re.fullmatch(r"carries ([01]+)", text)
        claimed = [int(c) for c in m.group(1)] if m else []
        score = 10 * leading_right(claimed, carries) / d if len(claimed) == d else 0.0
    elif call.parser == "arith_working":
        got = parse_working(text)
        claimed = got[0] if got else []
        pos = first_wrong(call.question, text)
        score = 10.0 if pos is None else (10 * pos / (d + 1) if got else 0.0)
    elif call.parser == "arith_critique":
        attempt = next(iter(call.inputs.values()), None)
        if attempt is None:
            return "", None
        score = 10.0 * (text == critique(call.question, attempt))
    elif call.parser == "boxed_answer":
        m = re.fullmatch(r"\\boxed\{(\d+)\}", text)
        got_digits = [int(c) for c in m.group(1)] if m else []
        score = 10 * leading_right(got_digits, sums) / (d + 1) if len(got_digits) == d + 1 else 0.0
    else:
        return "", None
    bias = call.cfg.team.scorer.bias
    if bias and claimed:
        score = min(10.0, score + 10 * bias * sum(claimed) / d)
    return f"SCORE: {score:g}", score
