"""The chain's logic (``soar.team.rollout.run_chain``) with outputs fixed by construction: a scripted generator
(a stand-in for a policy, named as such: it returns given texts, so what the chain does with them is checked
exactly) on the team world's formats. The leak check withholds and counts; an unparseable critique drops its
episode and the reviser never runs on it; the shuffled control reads another episode's critique; coach_delta's
sibling revision reads none; graded roles are graded."""

from __future__ import annotations

import numpy as np
import pytest

import soar
from soar.data import Problem
from soar.grading import make_grader
from soar.models import build_char_tokenizer
from soar.samples import Sample
from soar.team.credit import CreditParams, assign
from soar.team.episode import credit_inputs
from soar.team.metrics import episode_metrics
from soar.team.rollout import ChainRun, chain_info, derangement, run_chain

Q1, A1 = "123+456", "5790"   # 321 + 654 = 975: no carries
Q2, A2 = "999+100", "0001"   # 999 + 1 = 1000: carries 111
WRONG1, RIGHT1 = "carries 100 \\boxed{5890}", "carries 000 \\boxed{5790}"
WRONG2, RIGHT2 = "carries 011 \\boxed{0901}", "carries 111 \\boxed{0001}"


class ScriptedGenerator:
    """Stands in for a policy: each call returns, row by row, the next texts scripted for the role its prompts
    end with (``<solve>``, ``<critique>``, ``<revise>``); records the prompts it was given."""

    def __init__(self, tok, script: dict[str, list[str]]):
        self.tok, self.script, self.prompts = tok, script, {}

    def generate(self, prompts, params):
        role = next(r for r in self.script if prompts[0].endswith(f"<{r}>"))
        self.prompts[role] = list(prompts)
        texts = self.script[role]
        return [[Sample(t, self.tok(t).input_ids + [self.tok.eos_token_id], "stop")]
                for t in (texts[i % len(texts)] for i in range(len(prompts)))]

    def sync_weights(self, model):
        pass


SCRIPT = {"solve": [WRONG1, RIGHT1, RIGHT2, WRONG2],
          "critique": ["pos 0", "the sum is 5790", "ok", "hmm"],   # a critique, a leak, ok, unparseable
          "revise": [RIGHT1, RIGHT1, "carries 111 \\boxed{0011}"]}


def chain(*overrides, sibling=False, script=SCRIPT):
    cfg = soar.compose(["experiment=team_scr_arith_micro", *overrides])
    tok = build_char_tokenizer()
    gen = ScriptedGenerator(tok, script)
    problems = [Problem("p1", Q1, A1), Problem("p2", Q2, A2)]
    episodes = run_chain(cfg, problems, ChainRun("rollout", 0, False, 1.0, 2, sibling), {"policy": gen}, tok,
                         make_grader("integer"), context=10_000)
    return cfg, gen, episodes


def test_leak_drop_and_grades():
    cfg, gen, (e0, e1, e2, e3) = chain()
    assert e3.dropped == "coach/not_ok_or_pos" and "reviser" not in e3.turns
    assert len(gen.prompts["revise"]) == 3  # the dropped episode's reviser never ran
    assert e1.turns["coach"].leaked and e1.turns["coach"].parsed.shown == "?"
    assert gen.prompts["revise"][1].endswith("<critique>?</critique><revise>")  # the leaked critique withheld
    assert gen.prompts["revise"][0].endswith(f"<attempt>{WRONG1}</attempt><critique>pos 0</critique><revise>")
    assert [(e.turns["solver"].correct, e.turns["reviser"].correct) for e in (e0, e1, e2)] == \
        [(False, True), (True, True), (True, False)]
    info = chain_info(cfg.team)
    m = episode_metrics([e0, e1, e2, e3], info, "team/")
    assert (m["team/coach/leaked"], m["team/dropped"], m["team/wrong_to_right"], m["team/right_to_wrong"]) == (1, 1, 1, 1)
    assert m["team/fix_rate/carry"] == 1.0  # e0's first attempt had a wrong carry, and was fixed
    records, actions, _ = credit_inputs([e0, e1, e2, e3], info, needs_scores=False)
    out = assign("shared_outcome", records, actions, None, CreditParams())
    coach = [r for a, r in zip(actions, out.rewards) if a.role == "coach"]
    assert coach == [1.1, 0.0, 0.0]  # fixed: 1.1; the leaked critique earns 0 though its episode was right; e2 wrong


def test_shuffled_critique_reads_another_episode():
    _, gen, episodes = chain("team.roles.reviser.shuffle=[coach]")
    own = [e.turns["coach"].parsed.shown for e in episodes if e.dropped is None]
    read = [p.split("<critique>")[1].split("</critique>")[0] for p in gen.prompts["revise"]]
    assert sorted(read) == sorted(own) and all(r != o for r, o in zip(read, own))
    assert all(derangement(n, np.random.default_rng(n))[i] != i for n in range(2, 9) for i in range(n))


def test_sibling_revision_without_the_critique():
    _, gen, episodes = chain("team.credit=coach_delta", sibling=True,
                             script={**SCRIPT, "revise": [RIGHT1, RIGHT1, RIGHT2, WRONG1, RIGHT1, WRONG2]})
    prompts = gen.prompts["revise"]
    assert len(prompts) == 6 and all(p.endswith("<critique>?</critique><revise>") for p in prompts[3:])
    live = [e for e in episodes if e.dropped is None]
    assert [e.without_critique.correct for e in live] == [False, True, False]
    assert [e.turns["reviser"].correct for e in live] == [True, True, True]


@pytest.mark.parametrize("bad", ["\x00pos 1", "pos", "pos 1 and more", ""])
def test_a_critique_that_does_not_parse_always_drops(bad):
    _, _, episodes = chain(script={**SCRIPT, "critique": [bad]})
    assert all(e.dropped == "coach/not_ok_or_pos" for e in episodes)
