"""Tests for soar.grading: box extraction, the shaped reward, both graders, timeouts, registry."""
from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from soar import grading as G
from soar.grading import (
    REWARD_CORRECT,
    REWARD_NO_BOX,
    REWARD_PARTIAL,
    REWARD_WRONG_BOXED,
    CheckResult,
    Grade,
    IntegerGrader,
    MathVerifyGrader,
    extract_boxed,
    make_grader,
    normalize_answer,
)
from soar.student_rewards import STUDENT_REWARDS

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
CASES_CSV = Path(__file__).parent / "data" / "grading_cases.csv"

# (pred_text, gold, expected_correct) used for main-thread / thread / subprocess / pool parity.
PARITY_CASES = [
    (r"\boxed{\{2,1\}}", r"\{1,2\}", True),
    (r"\boxed{(0,1)}", r"(0,1]", False),
    (r"\boxed{(0,1]}", r"(0,1]", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{5\text{ cm}}", "5", True),
    (r"\boxed{\frac{1}{}}", r"\frac{1}{2}", False),
    (r"\boxed{1234}", "123", False),
    ("no box here, 123", "123", False),
]


# ----------------------------------------------------------------------------- helpers
def slow_check(content: str, gold: str) -> CheckResult:
    """Injected check_fn (runs in the pool worker): hangs on gold "slow"."""
    if gold == "slow":
        time.sleep(60)
    return CheckResult(content == gold, True, None)


def crash_check(content: str, gold: str) -> CheckResult:
    """Injected check_fn that kills its worker on gold "crash"."""
    if gold == "crash":
        os._exit(1)
    return CheckResult(content == gold, True, None)


class ConstGrader(G.Grader):
    """A user grader loaded through make_grader's dotted path."""

    name = "const"

    def __init__(self, value: bool = True) -> None:
        super().__init__()
        self.value = value

    def _grade_impl(self, pred_text, gold):
        return G._make_grade(extract_boxed(pred_text), gold, self.value), False


class NotAGrader:
    pass


def _as_tuples(grades: list[Grade]) -> list[list]:
    return [[g.correct, g.reward, g.boxed, g.partial, g.error] for g in grades]


@pytest.fixture(scope="module")
def mv():
    grader = MathVerifyGrader(timeout_s=30)  # generous: slow CI must not time out real items
    yield grader
    grader.close()


@pytest.fixture(scope="module")
def ig():
    return IntegerGrader()


# ------------------------------------------------------------------------ extraction
@pytest.mark.parametrize("text,expected", [
    (r"first \boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"answer: \boxed 5 done", "5"),
    (r"$\boxed 7$", "7"),
    (r"\fbox{x^{2}}", "x^{2}"),
    (r"\boxed {42}", "42"),
    (r"\boxed{\frac{1}{2}", None),  # unbalanced (truncated)
    ("no box", None),
    ("", None),
    (r"\boxedx{3}", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_normalize_answer():
    assert normalize_answer(r" $\left( 1, 2 \right)$. ") == "(1,2)"
    assert normalize_answer(r"1,\!000\,") == "1,000"
    assert normalize_answer(r"\text{ cm }") == "cm"
    assert normalize_answer(r"5\text{ \textbf{m}}") == "5m"


def test_shaped_reward_constants():
    assert (REWARD_CORRECT, REWARD_PARTIAL, REWARD_WRONG_BOXED, REWARD_NO_BOX) == (120.0, 20.0, 10.0, 0.0)
    assert G.shaped_reward(True, True, "3", "3") == (120.0, False)
    assert G.shaped_reward(True, False, "1234", "123") == (20.0, True)
    assert G.shaped_reward(True, False, "7", "123") == (10.0, False)
    assert G.shaped_reward(False, False, None, "123") == (0.0, False)
    assert G.shaped_reward(True, False, "7", "") == (10.0, False)  # empty gold: no partial credit


# ----------------------------------------------------------------------- math_verify
@pytest.mark.parametrize("pred,gold,expected", [
    (r"\boxed{\{2,1\}}", r"\{1,2\}", True),  # sets are unordered
    (r"\boxed{(0,1)}", r"(0,1]", False),  # open vs half-open interval
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{5\text{ cm}}", "5", True),  # units
    (r"\boxed{\frac{3}{4}}", "17", False),  # another problem's answer
])
def test_math_verify_semantics(mv, pred, gold, expected):
    grade = mv.grade(pred, gold)
    assert grade.correct is expected
    assert grade.reward == REWARD_CORRECT if expected else grade.reward in (REWARD_PARTIAL, REWARD_WRONG_BOXED)
    assert grade.boxed


def test_malformed_latex_never_raises(mv):
    g1 = mv.grade(r"\boxed{\frac{1}{}}", r"\frac{1}{2}")  # balanced box, broken LaTeX
    assert not g1.correct and g1.boxed and g1.reward == REWARD_WRONG_BOXED
    g2 = mv.grade(r"\boxed{\frac{1}{", r"\frac{1}{2}")  # unbalanced box = no box
    assert not g2.correct and not g2.boxed and g2.reward == REWARD_NO_BOX
    mv.reset_stats()
    g3 = mv.grade(r"\boxed{2}", r"\frac{1}{")  # broken gold: counted, not hidden
    assert not g3.correct and g3.error == "gold_unparseable"
    assert mv.stats.gold_unparseable == 1 and mv.stats.error_rate == 1.0


def test_no_box_gets_zero(mv, ig):
    for grader in (mv, ig):
        grade = grader.grade("The answer is 123.", "123")
        assert grade == Grade(False, REWARD_NO_BOX, False, False, None)
        assert grader.grade(r"\boxed{ }", "123").reward == REWARD_NO_BOX  # blank box earns nothing


def test_digit_padding_hack(mv):
    right = mv.grade(r"\boxed{123}", "123")
    assert right.correct and right.reward == REWARD_CORRECT
    for pred in (r"\boxed{1234}", r"\boxed{91239}"):
        grade = mv.grade(pred, "123")
        assert not grade.correct and grade.partial and grade.reward == REWARD_PARTIAL < right.reward


@pytest.mark.parametrize("grader_name", ["math_verify", "integer"])
@pytest.mark.parametrize("padded", ["1234", "91239", "1123", "1230", "-123", "123123", "12 34", "123, 4", "1.23"])
def test_padded_variants_never_earn_full_reward(mv, ig, grader_name, padded):
    grader = mv if grader_name == "math_verify" else ig
    grade = grader.grade(rf"\boxed{{{padded}}}", "123")
    assert not grade.correct
    assert grade.reward < REWARD_CORRECT


def _load_cases():
    with open(CASES_CSV, newline="") as f:
        return [(r["pred"], r["gold"], r["expected_correct"] == "true") for r in csv.DictReader(f)]


@pytest.mark.parametrize("pred,gold,expected", _load_cases())
def test_golden_cases(mv, pred, gold, expected):
    assert mv.grade(pred, gold).correct is expected


def test_golden_cases_batch_matches_single(mv):
    cases = _load_cases()
    preds, golds = [c[0] for c in cases], [c[1] for c in cases]
    single = [mv.grade(p, g) for p, g in zip(preds, golds)]
    assert mv.grade_batch(preds, golds) == single
    assert [g.correct for g in single] == [c[2] for c in cases]


# --------------------------------------------------------------------------- integer
@pytest.mark.parametrize("pred,gold,correct,reward", [
    (r"\boxed{25}", "025", True, REWARD_CORRECT),
    (r"\boxed{025}", "25", True, REWARD_CORRECT),
    (r"\boxed{27}", "27.0", True, REWARD_CORRECT),
    (r"\boxed{-7}", "-7", True, REWARD_CORRECT),
    (r"\boxed{+7}", "7", True, REWARD_CORRECT),
    (r"\boxed{1,234}", "1234", True, REWARD_CORRECT),
    (r"\boxed{1 234}", "1234", True, REWARD_CORRECT),
    (r"\boxed{1,2}", "12", False, REWARD_WRONG_BOXED),  # not thousands grouping
    (r"\boxed{27.5}", "27", False, REWARD_PARTIAL),  # non-integer, contains gold
    (r"\boxed{\frac{1}{2}}", "27", False, REWARD_WRONG_BOXED),
    (r"\boxed{abc}", "27", False, REWARD_WRONG_BOXED),
    (r"\boxed{7}", "-7", False, REWARD_WRONG_BOXED),
])
def test_integer_grader(ig, pred, gold, correct, reward):
    grade = ig.grade(pred, gold)
    assert (grade.correct, grade.reward, grade.error) == (correct, reward, None)


def test_integer_grader_bad_gold_counted():
    grader = IntegerGrader()
    grade = grader.grade(r"\boxed{3}", "27.5")
    assert not grade.correct and grade.error == "gold_unparseable"
    assert grader.stats.as_metrics()["grading/gold_unparseable_frac"] == 1.0
    grader.grade(r"\boxed{x}", "3")
    assert grader.stats.pred_unparseable == 1


# ------------------------------------------------------------- threads / processes
def test_threaded_grading_matches_main_thread(mv):
    preds, golds = [c[0] for c in PARITY_CASES], [c[1] for c in PARITY_CASES]
    main_single = [mv.grade(p, g) for p, g in zip(preds, golds)]
    assert [g.correct for g in main_single] == [c[2] for c in PARITY_CASES]
    box: dict = {}

    def work():  # math_verify's own signal.alarm timeouts would raise here
        try:
            local = MathVerifyGrader(use_process_pool=False)
            box["single"] = [local.grade(p, g) for p, g in zip(preds, golds)]
            box["batch"] = mv.grade_batch(preds, golds)  # pool used from a non-main thread
        except BaseException as e:  # surfaced below
            box["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join(100)
    assert "error" not in box, box.get("error")
    assert box["single"] == main_single and box["batch"] == main_single


def test_subprocess_grading_matches(mv):
    code = (
        "import json, sys; from soar.grading import MathVerifyGrader\n"
        "cases = json.loads(sys.stdin.read()); g = MathVerifyGrader(use_process_pool=False)\n"
        "print(json.dumps([[x.correct, x.reward, x.boxed, x.partial, x.error]"
        " for x in (g.grade(p, gd) for p, gd, _ in cases)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(PARITY_CASES), capture_output=True,
                         text=True, cwd=REPO, env=env, timeout=100, check=True)
    expected = _as_tuples([mv.grade(p, g) for p, g, _ in PARITY_CASES])
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


def test_import_is_light():
    code = "import sys, soar.grading; print(sorted({'torch', 'math_verify', 'sympy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_forced_timeout_is_counted():
    grader = MathVerifyGrader(timeout_s=1.0, check_fn=slow_check)
    try:
        t0 = time.monotonic()
        grades = grader.grade_batch([r"\boxed{a}", r"\boxed{a}", r"\boxed{b}", "no box"], ["a", "slow", "b", "c"])
        assert time.monotonic() - t0 < 30  # the hung worker was killed, not waited for
    finally:
        grader.close()
    assert grades[0].correct and grades[2].correct  # items after the timeout ran on a fresh pool
    assert grades[1].error == "timeout" and not grades[1].correct and grades[1].reward == REWARD_WRONG_BOXED
    assert grades[3].reward == REWARD_NO_BOX
    m = grader.stats.as_metrics()
    assert grader.stats.error_rate > 0 and m["grading/error_rate"] == 0.25 and m["grading/timeout_frac"] == 0.25
    assert m["grading/errors/timeout"] == 1.0


def test_real_pathological_input_times_out():
    """math_verify/sympy never finish on a power tower; grade() must still return."""
    grader = MathVerifyGrader(timeout_s=2.0)
    try:
        hung = grader.grade(r"\boxed{9^{9^{9^{9}}}}", "2")
        after = grader.grade(r"\boxed{2}", "2")  # a fresh pool took over
    finally:
        grader.close()
    assert hung.error == "timeout" and not hung.correct and hung.boxed
    assert after.correct and after.error is None
    assert grader.stats.as_metrics()["grading/timeout_frac"] == 0.5


def test_worker_crash_is_counted():
    grader = MathVerifyGrader(timeout_s=30, check_fn=crash_check)
    try:
        grades = grader.grade_batch([r"\boxed{a}", r"\boxed{x}", r"\boxed{b}"], ["a", "crash", "b"])
    finally:
        grader.close()
    assert grades[1].error == "worker_crash" and not grades[1].correct
    assert grades[0].correct and grades[2].correct


# ------------------------------------------------------------------ stats / registry
def test_stats_metrics_and_reset():
    grader = IntegerGrader()
    grader.grade_batch([r"\boxed{3}", r"\boxed{31}", "3"], ["3", "3", "3"])
    m = grader.stats.as_metrics(prefix="eval/")
    for key in ("error_rate", "gold_unparseable_frac", "pred_unparseable_frac", "partial_credit_frac"):
        assert f"eval/{key}" in m
    assert m["eval/partial_credit_frac"] == pytest.approx(1 / 3) and m["eval/error_rate"] == 0.0
    grader.reset_stats()
    assert grader.stats.graded == 0
    with pytest.raises(ValueError):
        grader.grade_batch(["a"], [])


def test_grader_pickles(mv):
    clone = pickle.loads(pickle.dumps(mv))  # e.g. shipped to a Ray worker
    try:
        assert clone._pool is None and clone.grade(r"\boxed{2}", "2").correct
    finally:
        clone.close()


def test_make_grader_registry_and_dotted_path():
    assert isinstance(make_grader("integer"), IntegerGrader)
    assert isinstance(make_grader("math_verify", timeout_s=2), MathVerifyGrader)
    for path in (f"{__name__}:ConstGrader", f"{__name__}.ConstGrader"):
        grader = make_grader(path, value=False)
        assert isinstance(grader, ConstGrader) and grader.grade(r"\boxed{1}", "1").reward == REWARD_PARTIAL
    with pytest.raises(TypeError):
        make_grader(f"{__name__}:NotAGrader")


def test_unknown_grader_lists_registered():
    with pytest.raises(ValueError, match="integer.*math_verify"):
        make_grader("sympy_magic")
    with pytest.raises(ValueError, match="registered graders"):
        make_grader("no_such_pkg.mod:Cls")


@pytest.mark.parametrize("pred, reward", [
    (r"so \boxed{579}", 1.0),  # right
    (r"\boxed{578}", 0.0),  # wrong
    (r"\boxed{five}", 0.0),  # well-formed box, content not an integer: wrong, not malformed
    ("579", -0.2),  # no box: missing
    (r"\boxed{579", -0.2),  # the last box never closes (cut off by max_tokens): malformed
    (r"\boxed{  }", -0.2),  # blank box: malformed
    (r"\boxed{579} then \boxed{57", -0.2),  # the last box is the answer, and it is cut
])
def test_format_penalty_reward(ig, pred, reward):
    grade = ig.grade(pred, "579")
    assert STUDENT_REWARDS["format_penalty"](grade) == reward
    assert STUDENT_REWARDS["shaped"](grade) == grade.reward  # the registry's other entry: the paper's 120/20/10/0


def test_rollout_rewards_follow_student_reward(ig):
    """``student.reward`` picks the reward RLOO sees (``grade_rollouts``): format_penalty keeps a signal in a
    group whose answers are all wrong, where some are malformed."""
    from soar.data import Problem
    from soar.policy.trainer import grade_rollouts
    from soar.samples import Sample

    group = [[Sample(t, [1], "stop") for t in (r"\boxed{1}", r"\boxed{2}", "2", r"\boxed{3")]]
    problems = [Problem("p", "1+1", "5")]
    _, shaped, correct, adv_shaped = grade_rollouts(ig, problems, group)
    _, penalised, _, adv_penalised = grade_rollouts(ig, problems, group, "format_penalty")
    assert shaped.tolist() == [[10.0, 10.0, 0.0, 0.0]] and correct.sum() == 0
    assert penalised[0].tolist() == pytest.approx([0.0, 0.0, -0.2, -0.2])
    assert adv_penalised.abs().sum() > 0
    with pytest.raises(KeyError):
        grade_rollouts(ig, problems, group, "no_such_reward")
