"""The leak check (soar.leak), pinned by hand: what counts as a coach's text carrying the gold answer."""

import pytest

from soar.leak import canonical, leaks


@pytest.mark.parametrize("text, answer, leak", [
    # long answers: anywhere, as a whole token
    ("the sum is 1234567 so", "1234567", True),
    ("carry at position 3 gives 12345670", "1234567", False),    # inside a longer number
    ("try 1234567.5 instead", "1234567", False),                 # a decimal continues the number
    ("check 1234567.", "1234567", True),                         # a full stop ends it
    ("x=$\\frac{3}{4}$ here", "\\frac{3}{4}", True),
    ("the maximum is near", "max", False),                       # inside a word
    ("use \\text{max} here", "\\text{max}", True),              # wrappers unwrapped on both sides
    ("so x + 1 is left", "x+1", True),                           # spaces around operators ignored
    ("CARRIES 1101", "carries 1101", True),                      # case ignored
    # short answers: only where stated as an answer
    ("step 3 is wrong: re-add the tens", "3", False),
    ("the answer is 3", "3", True),
    ("so \\boxed{3}", "3", True),
    ("FINAL: 3", "3", True),
    ("answer: -1", "-1", True),
    ("so x = 12", "12", True),
    ("so x = 12 and y", "12", False),
    ("the answer is 34", "3", False),
    ("anything", "", False),
])
def test_leaks(text, answer, leak):
    assert leaks(text, answer) is leak


def test_min_chars_moves_the_threshold():
    assert not leaks("step 3 is wrong", "3")
    assert leaks("step 3 is wrong", "3", min_chars=1)
    assert not leaks("position 12 of 1234", "1234", min_chars=5)


def test_canonical():
    assert canonical("  A  \\text{b} $c$ = \\left( d \\right) ") == "a b c=(d)"
