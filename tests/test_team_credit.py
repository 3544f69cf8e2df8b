"""The team credit functions (``soar.team.credit``) against values computed by hand, and the leak check on the
team path (a leaked action earns 0; ``soar.leak.leaks`` decides what leaks)."""

from __future__ import annotations

import pytest

from soar.leak import leaks
from soar.team.credit import (
    CREDITS,
    ActionRecord,
    CreditParams,
    EpisodeRecord,
    assign,
    groups_without_signal,
    per_agent_normalised,
    returns_to_go,
)

P = CreditParams(fix_bonus=0.1, kl_coef=0.01, gamma=1.0, outcome_weight=0.0, coach_role="coach")


def test_registry_names_the_issue_functions():
    assert {"shared_outcome", "outcome_only", "process", "coach_delta"} <= set(CREDITS)
    assert CREDITS["process"].needs_scores and CREDITS["process"].needs_kl and CREDITS["coach_delta"].needs_sibling


def test_shared_outcome_by_hand():
    episodes = [EpisodeRecord(0, first_correct=False, final_correct=True),   # fixed: r = 1 + 0.1 = 1.1
                EpisodeRecord(0, first_correct=True, final_correct=True),    # r = 1.0; group 0 mean 1.05
                EpisodeRecord(1, first_correct=True, final_correct=False),   # made wrong: r = 0
                EpisodeRecord(1, first_correct=False, final_correct=False)]  # r = 0; group 1 mean 0
    actions = [ActionRecord(0, "solver", "policy", 3), ActionRecord(0, "coach", "policy", 2, leaked=True),
               ActionRecord(1, "reviser", "policy", 1), ActionRecord(2, "solver", "policy", 2),
               ActionRecord(3, "reviser", "policy", 1)]
    out = assign("shared_outcome", episodes, actions, None, P)
    assert out.rewards == pytest.approx([1.1, 0.0, 1.0, 0.0, 0.0])
    # 1.1 - 1.05 on each of 3 tokens; the leaked critique earns 0: 0 - 1.05; 1.0 - 1.05; group 1: 0 - 0
    assert out.token_adv[0] == pytest.approx([0.05] * 3)
    assert out.token_adv[1] == pytest.approx([-1.05] * 2)
    assert out.token_adv[2] == pytest.approx([-0.05])
    assert out.token_adv[3] == [0.0, 0.0] and out.token_adv[4] == [0.0]


def test_returns_to_go_by_hand():
    # rewards per token: -0.01*0.1, -0.01*0.2, -0.01*0.3 + 0.7 = -0.001, -0.002, 0.697
    assert returns_to_go(0.7, [0.1, 0.2, 0.3], 0.01, 1.0) == pytest.approx([0.694, 0.695, 0.697])
    # gamma 0.5: 0.697; -0.002 + 0.5 * 0.697 = 0.3465; -0.001 + 0.5 * 0.3465 = 0.17225
    assert returns_to_go(0.7, [0.1, 0.2, 0.3], 0.01, 0.5) == pytest.approx([0.17225, 0.3465, 0.697])
    assert returns_to_go(1.0, [], 0.01, 1.0) == []


def test_per_agent_normalisation_by_hand():
    actions = [ActionRecord(0, "planner", "a", 2), ActionRecord(1, "verifier", "b", 2), ActionRecord(1, "planner", "a", 1)]
    # agent a: 1, 3, 5 -> mean 3, population std sqrt(8/3) = 1.632993; agent b: 2, 2 -> std 0 -> 0
    out = per_agent_normalised(actions, [[1.0, 3.0], [2.0, 2.0], [5.0]])
    assert out[0] == pytest.approx([-1.224745, 0.0], abs=1e-6) and out[2] == pytest.approx([1.224745], abs=1e-6)
    assert out[1] == [0.0, 0.0]


def test_process_by_hand():
    episodes = [EpisodeRecord(0, False, True), EpisodeRecord(0, False, False)]
    actions = [ActionRecord(0, "planner", "planner", 2, score=7.0), ActionRecord(0, "verifier", "verifier", 1, score=10.0),
               ActionRecord(1, "planner", "planner", 2, score=3.0)]
    kl = [[0.0, 0.0], [0.2], [0.5, 0.5]]
    out = assign("process", episodes, actions, kl, P)
    assert out.rewards == pytest.approx([0.7, 1.0, 0.3])
    # planner returns: [0.7, 0.7] and [-0.005 + 0.295, 0.295] = [0.29, 0.295]; mean 0.49625,
    # deviations 0.20375, 0.20375, -0.20625, -0.20125; population variance 0.04151719, std 0.20375765
    std = 0.20375765
    assert out.token_adv[0] == pytest.approx([0.20375 / std] * 2, abs=1e-5)
    assert out.token_adv[2] == pytest.approx([-0.20625 / std, -0.20125 / std], abs=1e-5)
    assert out.token_adv[1] == [0.0]  # the verifier agent's one token: its own mean
    # process plus outcome: the right final answer adds 1 to episode 0's actions
    both = assign("process", episodes, actions, kl, CreditParams(kl_coef=0.01, outcome_weight=1.0))
    assert both.rewards == pytest.approx([1.7, 2.0, 0.3])


def test_process_refuses_unscored_actions_and_zeroes_leaks():
    episodes = [EpisodeRecord(0, False, True)]
    with pytest.raises(ValueError, match="no score"):
        assign("process", episodes, [ActionRecord(0, "planner", "p", 1)], None, P)
    out = assign("process", episodes, [ActionRecord(0, "planner", "p", 1, score=9.0, leaked=True),
                                       ActionRecord(0, "planner", "p", 1, score=9.0)], None, P)
    assert out.rewards == [0.0, 0.9]


def test_outcome_only_by_hand():
    episodes = [EpisodeRecord(0, False, True), EpisodeRecord(0, True, False)]
    actions = [ActionRecord(0, "solver", "s", 1), ActionRecord(1, "solver", "s", 1)]
    out = assign("outcome_only", episodes, actions, [[0.0], [0.0]], P)
    # returns 1 and 0: mean 0.5, std 0.5 -> +1 and -1
    assert out.rewards == [1.0, 0.0]
    assert out.token_adv == [pytest.approx([1.0]), pytest.approx([-1.0])]


def test_coach_delta_by_hand():
    episodes = [EpisodeRecord(0, False, True, without_critique_correct=False),   # the critique fixed it: +1
                EpisodeRecord(0, False, True, without_critique_correct=True),    # fixed without it too: 0
                EpisodeRecord(1, True, False, without_critique_correct=True),    # the critique broke it: -1
                EpisodeRecord(1, False, True, without_critique_correct=False)]   # leaked: 0 - 0 = 0
    actions = [ActionRecord(i, "coach", "policy", 2, leaked=i == 3) for i in range(4)] + \
              [ActionRecord(0, "reviser", "policy", 1), ActionRecord(2, "reviser", "policy", 1)]
    out = assign("coach_delta", episodes, actions, None, P)
    assert [v[0] for v in out.token_adv[:4]] == pytest.approx([1.0, 0.0, -1.0, 0.0])
    assert out.rewards[:4] == [1.0, 1.0, 0.0, 0.0]
    # the reviser keeps shared_outcome's: group 0 both 1.1 (mean 1.1) -> 0; group 1: 0 vs 1.1 -> 0 - 0.55
    assert out.token_adv[4] == pytest.approx([0.0]) and out.token_adv[5] == pytest.approx([-0.55])
    with pytest.raises(ValueError, match="sibling"):
        assign("coach_delta", [EpisodeRecord(0, False, True)], [ActionRecord(0, "coach", "p", 1)], None, P)


def test_groups_without_signal():
    episodes = [EpisodeRecord(0, False, True), EpisodeRecord(0, False, False), EpisodeRecord(1, True, True),
                EpisodeRecord(1, True, True)]
    actions = [ActionRecord(i, "solver", "p", 1) for i in range(4)]
    assert groups_without_signal(episodes, actions, [1.0, 0.0, 1.0, 1.0]) == {"solver": 0.5}


def test_leak_check_on_team_texts():
    """What the team's coaches are zeroed for: the world's critiques never carry a 4-digit sum by their format;
    a MATH critique that states the answer does."""
    assert not leaks("pos 2", "0891") and not leaks("ok", "0891")
    assert leaks('{"error_type": "arithmetic", "fix": "the sum is 0891"}', "0891")
    assert leaks("FINAL: 17", "17") and not leaks('{"first_wrong_step": 17}', "17")


def test_per_token_advantages_reach_the_loss():
    """``RLOOTrainer.update(token_adv=...)``: a constant advantage per rollout trains exactly as ``adv_B`` does;
    other per-token values give another update."""
    import copy

    import torch

    from soar.config import StudentConfig
    from soar.models import build_char_tokenizer, build_tiny_llama
    from soar.policy.trainer import RLOOTrainer

    tok = build_char_tokenizer()
    base = build_tiny_llama(tok, hidden=16, layers=1, heads=2, max_positions=64, seed=3)
    cfg = StudentConfig(lr=1e-2, kl_coef=0.0, max_steps=2)
    prompts, completions = [tok("1+2=").input_ids] * 2, [tok("3").input_ids + [tok.eos_token_id], tok("45").input_ids]
    params = []
    for token_adv in (None, [[0.5, 0.5], [-1.0, -1.0]], [[0.5, -0.5], [-1.0, 1.0]]):
        trainer = RLOOTrainer(copy.deepcopy(base), tok, None, cfg, "{question}", seed=0)
        trainer.update(prompts, completions, torch.tensor([0.5, -1.0]), token_adv=token_adv)
        params.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert torch.allclose(params[0], params[1], atol=1e-7)
    assert not torch.allclose(params[0], params[2], atol=1e-5)
