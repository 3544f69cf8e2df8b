"""Answer grading and the SOAR paper's shaped reward (the students' rollout rewards built on a grade are
``soar.student_rewards``).

Graders ("integer": exact integers of the synthetic world; "math_verify": MATH-style
LaTeX via the lazily imported ``math_verify``, so this module needs no torch) share
one reward rule (:func:`shaped_reward`) and one error ledger (:class:`GradingStats`).
Correctness (accuracy) and reward (RL) are separate fields of :class:`Grade`.  The
process pool uses spawn: entry scripts need the ``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import multiprocessing
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

# The paper's shaped reward: the only place these numbers live.
REWARD_CORRECT = 120.0  # boxed and correct
REWARD_PARTIAL = 20.0  # boxed, wrong, but the gold answer appears inside the box
REWARD_WRONG_BOXED = 10.0  # boxed and wrong (format credit)
REWARD_NO_BOX = 0.0  # no (non-empty) box at all

_BOX_CMD = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm)\s*\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_SPACING = re.compile(r"\\[!,;: ]")
_INT_LITERAL = re.compile(r"[+-]?(?:\d+|\d{1,3}(?:,\d{3})+)")
_STATS_LOCK = threading.Lock()
log = logging.getLogger(__name__)
_SPAWN = multiprocessing.get_context("spawn")


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}``/``\\fbox{...}`` (nested braces ok; escaped
    ``\\{`` not counted) or ``\\boxed 5`` (one token, as in MATH).  None if absent or if
    the last box is unbalanced (truncated): no fallback to an earlier box, since the
    last one is the model's final word."""
    matches = list(_BOX_CMD.finditer(text or ""))
    if not matches:
        return None
    i = j = matches[-1].end()
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] == "{":
        depth, k = 0, j
        while k < len(text):
            if text[k] == "\\":  # skip the escaped char: \{ \} \\ are not structure
                k += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            if depth == 0:
                return text[j + 1 : k]
            k += 1
        return None
    m = re.match(r"[^\s$]+", text[j:]) if j > i else None  # "\boxed 5"
    return m.group(0) if m else None


def normalize_answer(s: str) -> str:
    """String normalisation for the partial-credit substring test, in order: ``\\text{X}``
    (also ``\\textbf``/``\\textrm``/``\\mbox``/``\\mathrm``) -> ``X``; drop ``\\left``/``\\right``,
    spacing ``\\! \\, \\; \\: \\ ``, ``\\$``, ``$`` and all whitespace; strip trailing ``.``.
    It never decides correctness."""
    s, prev = s or "", None
    while prev != s:  # unwrap nested \text{...} from the inside out
        prev, s = s, _TEXT_WRAP.sub(r"\1", s)
    s = _SPACING.sub("", _LEFT_RIGHT.sub("", s)).replace("\\$", "").replace("$", "")
    return re.sub(r"\s+", "", s).rstrip(".")


def shaped_reward(boxed: bool, correct: bool, boxed_content: str | None, gold_key: str) -> tuple[float, bool]:
    """``(reward, partial)``: 120 boxed+correct; 20 boxed+wrong with the normalised
    ``gold_key`` a substring of the normalised box content; 10 other boxed+wrong;
    0 without a box.  An empty gold never gives partial credit ("" is in anything).
    """
    if not boxed:
        return REWARD_NO_BOX, False
    if correct:
        return REWARD_CORRECT, False
    g = normalize_answer(gold_key)
    if g and g in normalize_answer(boxed_content or ""):
        return REWARD_PARTIAL, True
    return REWARD_WRONG_BOXED, False


@dataclass(frozen=True)
class Grade:
    """One graded prediction.  ``error`` is None, "timeout", "gold_unparseable",
    "worker_crash" or "exception:<Type>": something to count; ``correct`` stays the
    best verdict available (always False on timeouts, crashes and exceptions).  Such items
    keep the textual part of the shaped reward (10, or 20 with the gold inside the box): that
    rule needs no verifier, and an answer that stalls the verifier earns no more than the same
    answer judged wrong, so stalling it never pays."""
    correct: bool
    reward: float
    boxed: bool
    partial: bool
    error: str | None = None


def _make_grade(content: str | None, gold_key: str, correct: bool = False, error: str | None = None) -> Grade:
    """Grade from a box's content; a blank box counts as no box (no format credit for it)."""
    boxed = bool(content and content.strip())
    reward, partial = shaped_reward(boxed, correct and boxed, content, gold_key)
    return Grade(correct and boxed, reward, boxed, partial, error)


@dataclass
class GradingStats:
    """Running counts, so grading failures show up in metrics instead of as silent zeros."""
    graded: int = 0
    correct: int = 0
    no_box: int = 0
    partial: int = 0
    gold_unparseable: int = 0
    pred_unparseable: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def record(self, grade: Grade, pred_unparseable: bool = False) -> None:
        with _STATS_LOCK:  # graders may be shared by threads; a module lock keeps stats picklable
            self.graded += 1
            self.correct += grade.correct
            self.no_box += not grade.boxed
            self.partial += grade.partial
            self.pred_unparseable += bool(pred_unparseable)
            if grade.error:
                self.errors[grade.error] = self.errors.get(grade.error, 0) + 1
                self.gold_unparseable += grade.error == "gold_unparseable"

    def add(self, other: "GradingStats") -> None:
        """Fold in counts graded elsewhere (a ``soar.students.pool`` worker)."""
        with _STATS_LOCK:
            for name in ("graded", "correct", "no_box", "partial", "gold_unparseable", "pred_unparseable"):
                setattr(self, name, getattr(self, name) + getattr(other, name))
            for kind, count in other.errors.items():
                self.errors[kind] = self.errors.get(kind, 0) + count

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / self.graded if self.graded else 0.0

    def as_metrics(self, prefix: str = "grading/") -> dict[str, float]:
        n = max(self.graded, 1)
        out = {f"{prefix}graded": float(self.graded), f"{prefix}error_rate": self.error_rate,
               f"{prefix}timeout_frac": self.errors.get("timeout", 0) / n,
               f"{prefix}gold_unparseable_frac": self.gold_unparseable / n,
               f"{prefix}pred_unparseable_frac": self.pred_unparseable / n,
               f"{prefix}partial_credit_frac": self.partial / n,
               f"{prefix}no_box_frac": self.no_box / n, f"{prefix}accuracy": self.correct / n}
        for kind, count in self.errors.items():  # e.g. grading/errors/exception_ValueError
            out[f"{prefix}errors/{re.sub(r'[^A-Za-z0-9_]', '_', kind)}"] = float(count)
        return out


GRADER_METHODS = ("grade", "correct", "reward", "grade_batch")  # the protocol user classes must offer

GRADERS: dict[str, type] = {}
"""The built-in graders by ``data.grader`` name, each registered by ``register_grader`` where it is
defined; ``make_grader`` and ``soar.validation`` read it."""


def register_grader(grader_class: type) -> type:
    """Class decorator: ``data.grader=<grader_class.name>`` builds this grader."""
    GRADERS[grader_class.name] = grader_class
    return grader_class


class Grader:
    """Base class and protocol (:data:`GRADER_METHODS`); subclasses implement :meth:`_grade_impl`."""
    name = "base"

    def __init__(self) -> None:
        self.stats = GradingStats()

    def reset_stats(self) -> None:
        self.stats = GradingStats()

    def _grade_impl(self, pred_text: str, gold: str) -> tuple[Grade, bool]:
        """Return ``(grade, pred_unparseable)``."""
        raise NotImplementedError

    def grade(self, pred_text: str, gold: str) -> Grade:
        """Grade one prediction; never raises on bad model output; records stats."""
        try:
            grade, pred_bad = self._grade_impl(pred_text, gold)
        except Exception as e:  # counted in stats.errors, not hidden
            err = f"exception:{type(e).__name__}"
            grade, pred_bad = _make_grade(extract_boxed(pred_text), gold, error=err), False
        self.stats.record(grade, pred_bad)
        return grade

    def parseable(self, answer: str) -> bool:
        """Whether a teacher's boxed answer can serve as a gold answer (paper §2: "parsable by a
        symbolic math verifier"). Subclasses narrow it."""
        return bool(answer.strip())

    def correct(self, pred_text: str, gold: str) -> bool:  # grades again: call grade() for both
        return self.grade(pred_text, gold).correct

    def reward(self, pred_text: str, gold: str) -> float:
        return self.grade(pred_text, gold).reward

    def grade_batch(self, preds: list[str], golds: list[str]) -> list[Grade]:
        if len(preds) != len(golds):
            raise ValueError(f"{len(preds)} preds but {len(golds)} golds")
        return [self.grade(p, g) for p, g in zip(preds, golds)]


def _parse_int_literal(s: str) -> int | None:
    """Integer literal -> int: sign, leading zeros, spaces and thousands commas allowed. A literal
    beyond Python's int-string limit (``sys.get_int_max_str_digits()``, 4,300 digits) is no answer
    anyone means: None, like any other unparseable text."""
    s = normalize_answer(s).replace("{,}", ",").replace("\u2212", "-")
    if not _INT_LITERAL.fullmatch(s):
        return None
    try:
        return int(s.replace(",", ""))
    except ValueError:  # over the int-string limit
        return None


@register_grader
class IntegerGrader(Grader):
    """Exact integers (synthetic world): correct iff the box holds an integer literal equal
    to ``int(gold)`` (gold may be "025" or "27.0"); anything else boxed is wrong (10/20),
    never an exception.  The substring test uses the canonical gold ("025" -> "25")."""
    name = "integer"

    @staticmethod
    def parse_gold(gold: str) -> int | None:
        value = _parse_int_literal(str(gold))
        if value is None:  # integral float such as "27.0" (inf/nan are not integral)
            with contextlib.suppress(ValueError):
                f = float(normalize_answer(str(gold)).replace(",", ""))
                value = int(f) if f.is_integer() else None
        return value

    def parseable(self, answer: str) -> bool:
        return self.parse_gold(answer) is not None

    def _grade_impl(self, pred_text: str, gold: str) -> tuple[Grade, bool]:
        content, gold_int = extract_boxed(pred_text), self.parse_gold(gold)
        pred_int = _parse_int_literal(content) if content else None
        grade = _make_grade(content, str(gold if gold_int is None else gold_int), gold_int is not None and
                            pred_int == gold_int, None if gold_int is not None else "gold_unparseable")
        return grade, grade.boxed and pred_int is None


class CheckResult(NamedTuple):
    """One math_verify comparison (picklable: crosses the process boundary)."""
    correct: bool
    pred_parsed: bool
    error: str | None = None


_MV: dict = {}  # lazily loaded math_verify pieces, per process


def _load_math_verify() -> dict:
    if not _MV:
        import math_verify
        from math_verify import LatexExtractionConfig, parse, verify
        # We switch its signal.alarm timeouts off and bound time ourselves: silence the warning.
        for mod in ("parser", "grader"):
            if hasattr(getattr(math_verify, mod, None), "TIMEOUT_WARNING_SHOWN"):
                getattr(math_verify, mod).TIMEOUT_WARNING_SHOWN = True
        # Boxed-first extraction without anchor-less guessing, as in TRL's accuracy reward.
        cfg = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
        _MV.update(parse=parse, verify=verify, cfg=cfg)
    return _MV


def _mv_parse(s: str) -> list:
    """Parse one answer as ``$\\boxed{s}$``, timeouts off.  math_verify 0.9 leaves
    ``\\boxed{50\\%}`` and ``\\boxed{5.}`` unparsed, so drop percent signs (MATH convention:
    "50\\%" is graded as 50) and a trailing period after a digit or brace first."""
    s = (s or "").strip().replace("\\%", "").replace("%", "")
    s = re.sub(r"(?<=[0-9}])\.\s*$", "", s).strip()
    mv = _load_math_verify()
    return mv["parse"]("$\\boxed{" + s + "}$", extraction_config=mv["cfg"],
                       extraction_mode="first_match", parsing_timeout=None)


def math_verify_check(boxed_content: str, gold: str, float_rounding: int = 6,
                      strict: bool = True) -> CheckResult:
    """Compare a box's content with gold via math_verify, its timeouts OFF (the caller
    bounds time); never raises.  A parse with only string fallbacks (no sympy object)
    counts as unparseable, but is still compared (math_verify then matches strings)."""
    try:
        gold_p = _mv_parse(gold)
        if not gold_p:
            return CheckResult(False, True, "gold_unparseable")
        pred_p = _mv_parse(boxed_content)
        # gold FIRST: verify is asymmetric (assignments like "x=3", intervals).
        ok = bool(pred_p) and bool(_load_math_verify()["verify"](
            gold_p, pred_p, float_rounding=float_rounding, strict=strict, timeout_seconds=None))
        gold_ok, pred_ok = (any(not isinstance(x, str) for x in p) for p in (gold_p, pred_p))
        return CheckResult(ok, pred_ok, None if gold_ok else "gold_unparseable")
    except Exception as e:
        return CheckResult(False, True, f"exception:{type(e).__name__}")


def math_verify_parseable(answer: str) -> bool:
    """Whether math_verify parses ``answer`` into a symbolic (non-string) object; never raises."""
    try:
        return any(not isinstance(x, str) for x in _mv_parse(answer))
    except Exception:
        return False


@register_grader
class MathVerifyGrader(Grader):
    """math_verify grader with self-managed, thread-safe timeouts.  With ``use_process_pool``
    (default) boxed items go to a lazy, reused spawn-context pool of ``max_workers``, waiting
    at most ``timeout_s`` per item; on a timeout the pool is killed and recreated and the item
    gets ``error="timeout"``; ``parseable`` is bounded the same way.  Without it, both run
    in-process with math_verify's timeouts off (safe in threads and Ray actors, but unbounded in
    time).  ``check_fn``: picklable
    ``(boxed_content, gold) -> CheckResult`` replacing the default."""
    name = "math_verify"

    def __init__(self, timeout_s: float = 5.0, max_workers: int = 1, use_process_pool: bool = True,
                 float_rounding: int = 6, strict: bool = True, startup_timeout_s: float = 120.0,
                 check_fn: Callable[[str, str], CheckResult] | None = None) -> None:
        super().__init__()
        if check_fn is None:
            importlib.import_module("math_verify")  # fail loudly now, not as 100% errors later
        self.timeout_s, self.max_workers = float(timeout_s), int(max_workers)
        self.use_process_pool, self.check_fn, self._pool = use_process_pool, check_fn, None
        self.float_rounding, self.strict, self.startup_timeout_s = float_rounding, strict, startup_timeout_s

    def parseable(self, answer: str) -> bool:
        """math_verify yields a symbolic (non-string) object for it. Parsing can hang like verifying
        (2,000 nested braces: 14-30 s), and teacher answers are untrusted model text, so with the
        process pool it is bounded by ``timeout_s`` too: an answer that times out is unparseable."""
        if not self.use_process_pool:
            return math_verify_parseable(answer)
        return self._call_bounded(math_verify_parseable, answer) is True

    def _fn(self) -> Callable[[str, str], CheckResult]:
        # functools.partial of a module-level function pickles; a lambda would not.
        return self.check_fn or functools.partial(math_verify_check, float_rounding=self.float_rounding,
                                                  strict=self.strict)

    @staticmethod
    def _to_grade(content: str | None, gold: str, res: CheckResult | None) -> tuple[Grade, bool]:
        if res is None:  # no box: nothing was parsed
            return _make_grade(content, gold), False
        return _make_grade(content, gold, bool(res.correct), res.error), not res.pred_parsed

    def _grade_impl(self, pred_text: str, gold: str) -> tuple[Grade, bool]:
        content = extract_boxed(pred_text)
        res = self._fn()(content, gold) if content and content.strip() else None
        return self._to_grade(content, gold, res)

    def grade(self, pred_text: str, gold: str) -> Grade:
        if self.use_process_pool:  # time-bounded too: "9^{9^{9^{9}}}" hangs sympy for good
            return self.grade_batch([pred_text], [gold])[0]
        return super().grade(pred_text, gold)

    def grade_batch(self, preds: list[str], golds: list[str]) -> list[Grade]:
        if not self.use_process_pool or not preds:
            return super().grade_batch(preds, golds)
        boxes = [extract_boxed(p) for p in preds]
        out: list = [None if c and c.strip() else self._to_grade(c, g, None)
                     for c, g in zip(boxes, golds, strict=True)]
        pending, fn = [i for i, o in enumerate(out) if o is None], self._fn()
        while pending:  # every round settles at least one item, so this terminates
            pool = self._get_pool()
            futs = {i: pool.submit(fn, boxes[i], golds[i]) for i in pending}
            retry: list[int] = []
            for pos, i in enumerate(pending):
                try:
                    out[i] = self._to_grade(boxes[i], golds[i], futs[i].result(timeout=self.timeout_s))
                    continue
                except FuturesTimeout:
                    out[i] = (_make_grade(boxes[i], golds[i], error="timeout"), False)
                except Exception as e:  # BrokenProcessPool: blame the item we waited on
                    crash = "BrokenProcessPool" in type(e).__name__
                    err = "worker_crash" if crash else f"exception:{type(e).__name__}"
                    out[i] = (_make_grade(boxes[i], golds[i], error=err), False)
                    if not crash:
                        continue
                # Hung or broken pool: keep finished results, kill it, resubmit the rest.
                for j in pending[pos + 1:]:
                    f = futs[j]
                    if f.done() and not f.cancelled() and f.exception() is None:
                        out[j] = self._to_grade(boxes[j], golds[j], f.result())
                    else:
                        retry.append(j)
                self._kill_pool()
                break
            pending = retry
        for grade, pred_bad in out:
            self.stats.record(grade, pred_bad)
        return [g for g, _ in out]

    def _call_bounded(self, fn, *args):
        """``fn(*args)`` in the pool within ``timeout_s``; None when it times out or kills its worker
        (the pool is then replaced, as in ``grade_batch``)."""
        future = self._get_pool().submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except FuturesTimeout:
            log.warning("math_verify gave up on %s after %.0f s (%d characters)", fn.__name__, self.timeout_s,
                        sum(len(str(a)) for a in args))
        except BrokenProcessPool:
            log.warning("math_verify's worker died in %s (%d characters)", fn.__name__, sum(len(str(a)) for a in args))
        self._kill_pool()
        return None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:  # spawn: forking a process with threads/CUDA/Ray state is unsafe.
            self._pool = ProcessPoolExecutor(self.max_workers, mp_context=_SPAWN)
            if self.check_fn is None:  # warm-up: pay the sympy import before item timeouts start
                try:
                    warm = [self._pool.submit(math_verify_check, "1", "1") for _ in range(self.max_workers)]
                    for f in warm:
                        f.result(timeout=self.startup_timeout_s)
                except Exception as e:
                    self._kill_pool()
                    raise RuntimeError(f"math_verify grading pool failed to start: {e!r}") from e
        return self._pool

    def _kill_pool(self) -> None:
        """Hard-kill the workers: a hung sympy call cannot be interrupted any other way."""
        pool, self._pool = self._pool, None
        procs = list((getattr(pool, "_processes", None) or {}).values())  # no public API for this
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=2)

    def close(self) -> None:  # stop the worker pool; the next use starts a new one
        self._kill_pool()

    def __getstate__(self):  # a pool cannot be pickled; a copy starts its own
        return {**self.__dict__, "_pool": None}


def make_grader(name: str, **kwargs) -> Grader:
    """Build a grader by registered name or dotted path ("pkg.mod:Cls" or "pkg.mod.Cls")."""
    if name in GRADERS:
        return GRADERS[name](**kwargs)
    hint = f"registered graders: {', '.join(sorted(GRADERS))}; or a dotted path 'pkg.module:ClassName'"
    if ":" not in name and "." not in name:
        raise ValueError(f"unknown grader {name!r}; {hint}")
    mod_name, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot load grader {name!r} ({e}); {hint}") from e
    grader = cls(**kwargs)
    if not all(callable(getattr(grader, m, None)) for m in GRADER_METHODS):
        raise TypeError(f"{name!r} does not implement {'/'.join(GRADER_METHODS)}")
    return grader
