"""What a user sees: progress bars and log lines on a terminal and in a log file, the outer loop's
ETA, the end summary's words, and the pieces of the reward plot's moving average. The whole
``soar-train`` run in a log file is ``tests/test_loop.py``'s (its ``reference_run``)."""

import contextlib
import io
import logging
import re
import sys

import pytest

import soar
from soar.console import console_above_bars, plural, progress_bar, train_summary_text
from soar.loop import outer_loop_bar
from soar.report import moving_average_segments


class Terminal(io.StringIO):
    """A text stream that says it is a terminal (tqdm draws bars only on one)."""

    def isatty(self) -> bool:
        return True


def test_a_bar_draws_nothing_into_a_file_or_pipe_and_nothing_when_turned_off():
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        bar = progress_bar(enabled, total=3, file=stream)
        for _ in range(3):
            bar.update(1)
        bar.close()
        assert stream.getvalue() == ""
    stream = Terminal()
    with progress_bar(True, total=3, file=stream) as bar:
        bar.update(3)
    assert "3/3" in stream.getvalue()  # the same bar on a terminal


def test_log_lines_print_on_lines_of_their_own_above_a_bar_on_a_terminal(monkeypatch):
    """A console log line during a bar clears it, prints, and the bar redraws below: after every carriage
    return or newline, a step line starts at the line's first column. Without ``console_above_bars`` the
    line is written straight after the bar's last frame (``...it/s]step 2/3 | ...``)."""
    for redirect in (False, True):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stdout", terminal)  # Hydra's console handler writes to sys.stdout
        handler = logging.StreamHandler(sys.stdout)
        logging.root.addHandler(handler)
        log = logging.getLogger("soar.test_console")
        monkeypatch.setattr(log, "level", logging.INFO)
        try:
            with console_above_bars() if redirect else contextlib.nullcontext():
                bar = progress_bar(True, total=3, file=terminal, mininterval=0)
                for step in range(1, 4):
                    bar.update(1)
                    log.info("step %d/3 | reward mean +0.0100", step)
                bar.close()
        finally:
            logging.root.removeHandler(handler)
        pieces = re.split(r"[\r\n]", terminal.getvalue())
        assert sum(p.startswith("step ") for p in pieces) == (3 if redirect else 0), terminal.getvalue()
        assert any("3/3" in p for p in pieces)  # the bar was drawn


def test_the_outer_loop_eta_is_right_after_the_first_step():
    """arith_micro: 3 steps of 4 students (g 2 x r 2). A first step of 40 s whose students finish in one
    burst leaves 2 steps, 80 s: the ETA says 01:20 (tqdm's default rate, a moving average over its redraws,
    took the burst's first student for the step's 40 s and said 05:20). Stacked students are counted in
    one update (``tests/test_stacked_students.py``)."""
    cfg = soar.compose(["experiment=arith_micro"])
    bar = outer_loop_bar(cfg, 0, file=Terminal())
    clock = [0.0]
    bar._time = lambda: clock[0]  # tqdm's clock, for a step of exactly 40 s
    bar.start_t = bar.last_print_t = 0.0
    clock[0] = 40.0
    for _ in range(4):
        bar.update(1)
    bar.set_postfix(step=1)  # the loop's redraw at the end of the step
    assert bar.total == 12 and bar.unit == "student"
    assert "4/12 [00:40<01:20" in str(bar)
    assert outer_loop_bar(cfg, 2, file=Terminal()).total == 4  # a resumed run counts the steps it has left


def test_the_summary_names_what_the_run_wrote_with_plurals_in_words(tmp_path):
    promotion = {"promotion": 1, "step": 2, "path": "promoted/promotion_01", "hard_train_acc": 0.25, "hard_test_acc": 0.125}
    summary = {"steps": 3, "promotions": [promotion], "pq_size": 8, "run_dir": str(tmp_path)}
    assert train_summary_text(summary).splitlines() == [
        f"soar-train: 3 outer steps, 1 promotion, 8 Promotion Questions in {tmp_path / 'pq.jsonl'}",
        f"  promotion 1 at step 2: {tmp_path / 'promoted' / 'promotion_01'} (greedy accuracy on hard train 0.250, "
        "hard test 0.125)",
        f"  metrics: {tmp_path / 'metrics.jsonl'}; summary: {tmp_path / 'summary.json'}"]
    first = train_summary_text({**summary, "steps": 1, "promotions": [], "pq_size": 1}).splitlines()[0]
    assert first.startswith("soar-train: 1 outer step, 0 promotions, 1 Promotion Question in ")
    assert [plural(n, "promotion") for n in (0, 1, 2)] == ["0 promotions", "1 promotion", "2 promotions"]


@pytest.mark.parametrize("averages, resets, pieces", [
    # window 2, a promotion at step 2 (reset), the window refills at step 3: two pieces, none across 2-4
    ([None, -0.5, None, 0.1, 0.2], {2}, [([2], [-0.5]), ([4, 5], [0.1, 0.2])]),
    # window 1: never None, yet the reset after the promotion at step 3 breaks the line there
    ([0.1, 0.2, 0.3, -0.1, 0.0], {3}, [([1, 2, 3], [0.1, 0.2, 0.3]), ([4, 5], [-0.1, 0.0])]),
    # two promotions in a row (window 1): each its own piece
    ([0.1, 0.2, 0.3, 0.4, 0.5], {2, 3}, [([1, 2], [0.1, 0.2]), ([3], [0.3]), ([4, 5], [0.4, 0.5])]),
    # no reset (promotion.reset_window false, or no promotion): one line over the full windows
    ([None, 0.1, 0.2, 0.3, 0.4], set(), [([2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4])]),
    ([None, None, None, None, None], set(), []),
], ids=["window2_reset", "window1_reset", "back_to_back", "no_reset", "never_full"])
def test_the_moving_average_is_drawn_in_pieces_broken_at_each_reset(averages, resets, pieces):
    assert moving_average_segments([1, 2, 3, 4, 5], averages, resets) == pieces
