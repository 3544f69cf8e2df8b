"""A team's per-role metrics (``soar.team.metrics``) and the credit records (``soar.team.episode``) on episodes
built by hand in the team world's formats, and the world's formats, tool and stand-in coach by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from soar.team.episode import ChainInfo, Episode, Turn, credit_inputs
from soar.team.formats import PARSERS, ScoreCall, critique_json, parse_score
from soar.team.metrics import episode_metrics
from soar.worlds.arith_team import critique, first_wrong
from soar.worlds.arith_team_formats import digit_add, error_type, stand_in_score  # registers the world's formats

Q, RIGHT = "123+456", "carries 000 \\boxed{5790}"  # 321 + 654 = 975, least significant digit first
CHAIN = ChainInfo(("solver", "coach", "reviser"), ("solver", "reviser"), ("solver", "coach", "reviser"),
                  {"solver": "arith_working", "coach": "arith_critique", "reviser": "arith_working"}, "coach")


def turn(role: str, text: str, tokens: int, correct=None, score=None, score_dropped=None) -> Turn:
    return Turn(role, "policy", f"<{role}>", text, [7] * tokens, PARSERS[CHAIN.parsers[role]].fn(text), True,
                correct=correct, score=score, score_dropped=score_dropped)


def episodes() -> list[Episode]:
    e0 = Episode(Q, "5790", 0, turns={"solver": turn("solver", "carries 100 \\boxed{5890}", 5, False),
                                      "coach": turn("coach", "pos 0", 2, score=8.0),
                                      "reviser": turn("reviser", RIGHT, 5, True)})
    e1 = Episode(Q, "5790", 0, turns={"solver": turn("solver", RIGHT, 5, True), "coach": turn("coach", "ok", 2, score=2.0),
                                      "reviser": turn("reviser", "carries 000 \\boxed{5791}", 5, False)})
    e2 = Episode(Q, "5790", 1, turns={"solver": turn("solver", "carries 000 \\boxed{5791}", 5, False),
                                      "coach": turn("coach", "pos 3", 3, score_dropped="unparseable"),
                                      "reviser": turn("reviser", "carries 000 \\boxed{5792}", 5, False)})
    e3 = Episode(Q, "5790", 1, turns={"solver": turn("solver", RIGHT, 5, True), "coach": turn("coach", "maybe", 4)},
                 dropped="coach/not_ok_or_pos")
    return [e0, e1, e2, e3]


def test_episode_metrics_by_hand():
    m = episode_metrics(episodes(), CHAIN, "team/")
    assert m["team/episodes"] == 4 and m["team/dropped"] == 1 and m["team/dropped/coach/not_ok_or_pos"] == 1
    assert m["team/solver/accuracy"] == pytest.approx(1 / 3) and m["team/reviser/accuracy"] == pytest.approx(1 / 3)
    assert m["team/accuracy_before"] == pytest.approx(1 / 3) and m["team/accuracy_after"] == pytest.approx(1 / 3)
    assert m["team/wrong_to_right"] == 1 and m["team/right_to_wrong"] == 1
    assert (m["team/wrong_first/carry"], m["team/fix_rate/carry"]) == (1, 1.0)
    assert (m["team/wrong_first/digit"], m["team/fix_rate/digit"]) == (1, 0.0)
    assert m["team/tokens_per_episode"] == pytest.approx((12 + 12 + 13 + 9) / 4)
    assert m["team/solver/tokens_mean"] == 5 and m["team/coach/tokens_mean"] == pytest.approx(2.75)
    assert m["team/coach/parse_fail"] == pytest.approx(0.25)
    # the coach's scores against the final answer: 8 (right), 2 (wrong), one dropped
    assert m["team/score/coach/mean"] == 5 and m["team/score/coach/mean_if_right"] == 8
    assert m["team/score/coach/mean_if_wrong"] == 2 and m["team/score/coach/corr_success"] == pytest.approx(1.0)
    assert m["team/score/coach/dropped"] == 1


def test_credit_inputs_leave_out_dropped_episodes_and_scores():
    records, actions, turns = credit_inputs(episodes(), CHAIN, needs_scores=False)
    assert [(r.group, r.first_correct, r.final_correct) for r in records] == [(0, False, True), (0, True, False),
                                                                               (1, False, False)]
    assert len(actions) == 9 and [a.tokens for a in actions[:3]] == [5, 2, 5]
    _, scored, _ = credit_inputs(episodes(), CHAIN, needs_scores=True)
    assert len(scored) == 8 and not any(a.role == "coach" and a.episode == 2 for a in scored)


def test_world_formats_by_hand():
    assert first_wrong(Q, RIGHT) is None and critique(Q, RIGHT) == "ok"
    assert first_wrong(Q, "carries 100 \\boxed{5890}") == 0 and error_type(Q, "carries 100 \\boxed{5890}") == "carry"
    assert first_wrong(Q, "carries 000 \\boxed{5791}") == 3 and error_type(Q, "carries 000 \\boxed{5791}") == "digit"
    assert first_wrong(Q, "garbage") == 0 and error_type(Q, "garbage") == "format"
    # 999 + 001 (lsb first "999+100"): carries 111, sum 1000 -> "0001"
    assert digit_add("999+100", "carries 111").shown == "sum 0001 flags 000"
    # the first carry missed: 9+1 = 10 -> 0, then 9+0+0 = 9, 9+0+1 = 10 -> 0, top digit the last carry 1;
    # flags: position 0 carries but the plan says not, position 1 does not but the plan says it does
    assert digit_add("999+100", "carries 011").shown == "sum 0901 flags 110"
    assert digit_add("999+100", "carries 01").reason == "bad_plan"
    assert PARSERS["arith_critique"].drops and not PARSERS["arith_working"].drops
    assert PARSERS["arith_critique"].fn("pos 2").ok and not PARSERS["arith_critique"].fn("pos two").ok


def test_stand_in_coach_by_hand():
    team = SimpleNamespace(scorer=SimpleNamespace(bias=0.0))
    cfg = SimpleNamespace(team=team)
    plan = ScoreCall(cfg, "planner", "arith_plan", "999+100", "carries 101", {}, None)
    assert stand_in_score(plan) == ("SCORE: 3.33333", pytest.approx(10 / 3))  # 1 of 3 leading carries right
    team.scorer.bias = 0.3  # + 10 x 0.3 x 2/3 carries claimed
    assert stand_in_score(plan)[1] == pytest.approx(10 / 3 + 2)
    team.scorer.bias = 0.0
    answer = ScoreCall(cfg, "verifier", "boxed_answer", "999+100", "\\boxed{0001}", {}, "0001")
    assert stand_in_score(answer)[1] == 10.0
    assert stand_in_score(ScoreCall(cfg, "verifier", "boxed_answer", "999+100", "\\boxed{0011}", {}, "0001"))[1] == 5.0


def test_llm_formats():
    assert parse_score("the plan is fine.\nSCORE: 7") == 7.0 and parse_score("SCORE: 11") is None
    assert parse_score("no score") is None and parse_score("SCORE: 3\nSCORE: 9") == 9.0
    ok = critique_json('Here: {"error_type": "Arithmetic", "first_wrong_step": 2, "fix": "redo step 2"}')
    assert ok.ok and ok.error_type == "arithmetic"
    assert critique_json('{"error_type": "logic"}').reason == "missing_keys" and critique_json("none").reason == "no_json"
    assert PARSERS["boxed_answer"].fn("so FINAL: 12.").answer == "12"
    assert PARSERS["boxed_answer"].fn("\\boxed{\\frac{1}{2}} FINAL: 3").answer == "\\frac{1}{2}"
