"""The outer loop's decisions, pinned by hand: set-level advantages, promotion (moving average,
window reset, median replicate), intrinsic rewards, teacher-output parsing, rejection sampling, diversity metrics."""

import numpy as np
import pytest

from soar.diversity import mean_pairwise_cosine_distance, vendi_score
from soar.generation import Sample, SamplingParams
from soar.rewards import QUESTION_REWARDS, TEACHER_REWARDS
from soar.students.promotion import PromotionPolicy, median_replicate
from soar.teachers.parse import Pair, Reject, parse_pair
from soar.teachers.sampling import RejectionCapError, sample_valid
from soar.teachers.update import dataset_advantages

pytestmark = pytest.mark.timeout(60)


class Promo:
    def __init__(self, tau=0.01, window=3, reset_window=True, enabled=True):
        self.tau, self.window, self.reset_window, self.enabled = tau, window, reset_window, enabled


def test_dataset_advantages_sum_to_zero_and_ignore_shifts():
    r = np.array([0.05, -0.01, 0.02, 0.0])
    a = dataset_advantages(r)
    assert a[0] == pytest.approx(0.05 - (-0.01 + 0.02 + 0.0) / 3)
    assert a.sum() == pytest.approx(0.0, abs=1e-12)
    assert dataset_advantages(r + 0.37) == pytest.approx(a)
    assert (dataset_advantages(np.full(4, 0.03)) == 0).all()  # all equal -> A = 0 -> skipped step


def test_accepted_rollouts_carry_zero_sum_advantages():
    """Every rollout of dataset k gets A_k; with equal n per dataset the rollouts' A sum to 0."""
    n, r = 5, np.array([0.1, 0.0, 0.3])
    per_rollout = np.repeat(dataset_advantages(r), n)
    assert per_rollout.sum() == pytest.approx(0.0, abs=1e-12)


def test_median_replicate_odd_even_and_ties():
    assert median_replicate([0.3, 0.1, 0.2]) == 2
    # even r: closest to mean of the two middle values (0.1+0.2)/2=0.15 -> tie 0.1 / 0.2 -> lower reward
    assert median_replicate([0.4, 0.2, 0.1, 0.0]) == 2
    assert median_replicate([0.0, 0.0, 0.5, 0.5]) == 0  # tie in reward -> lower index
    assert median_replicate([0.2, 0.1]) == 1


def test_promotion_needs_a_full_window_and_uses_current_step():
    p = PromotionPolicy(Promo(tau=0.01, window=3))
    assert not p.update([[0.5, 0.5]]).promote  # partial window: 1/3
    assert not p.update([[0.5, 0.5]]).promote  # 2/3
    d = p.update([[-0.9, -0.9], [0.0, 0.0]])  # MA = (0.5 + 0.5 - 0.45) / 3 > 0.01
    assert d.promote and d.moving_average == pytest.approx((0.5 + 0.5 - 0.45) / 3)
    assert d.dataset == 1 and p.history == []  # best dataset; window reset


def test_promotion_picks_best_dataset_and_median_student():
    p = PromotionPolicy(Promo(tau=0.0, window=1))
    d = p.update([[0.1, 0.1, 0.1], [0.3, 0.0, 0.6], [0.2, 0.2, 0.2]])
    assert d.promote and d.dataset == 1 and d.replicate == 0  # median of (0.3, 0.0, 0.6) is 0.3


def test_without_window_reset_a_post_promotion_drop_promotes_again():
    """Rewards are measured against the new baseline after a promotion, so they drop; without a
    reset the old high rewards keep the moving average above tau -> back-to-back promotion."""
    steps = [[[0.05]], [[0.05]], [[0.05]], [[-0.01]], [[-0.02]]]

    def promotions(reset):
        p = PromotionPolicy(Promo(tau=0.01, window=3, reset_window=reset))
        return [p.update(r).promote for r in steps]

    assert promotions(reset=True) == [False, False, True, False, False]
    assert promotions(reset=False) == [False, False, True, True, False]  # (0.05+0.05-0.01)/3 = 0.03


def test_disabled_promotion_still_reports_the_moving_average():
    p = PromotionPolicy(Promo(window=1, enabled=False))
    d = p.update([[1.0]])
    assert not d.promote and d.moving_average == 1.0 and "disabled" in d.reason


def test_intrinsic_rewards():
    def question_reward(s, kind):
        return QUESTION_REWARDS[kind](s)

    assert question_reward(0.0, "intrinsic") == 0.0  # unsolvable: no reward (paper Eq. 8)
    assert question_reward(0.25, "intrinsic") == 0.75
    assert question_reward(1.0, "intrinsic") == 0.0
    assert question_reward(0.5, "intrinsic_4p1p") == 1.0
    assert question_reward(0.75, "intrinsic_min") == 0.25
    assert [question_reward(s, "intrinsic_mixed") for s in (0.0, 0.3, 1.0)] == [0.0, 1.0, 0.0]


class RightOnCue:
    """Stands in for the base student (no model: fixed answers, to pin the reward's arithmetic): a question
    "<c> of <n>" gets ``c`` right answers of its ``n`` samples."""

    def __init__(self):
        self.synced = []

    def sync_weights(self, model):
        self.synced.append(model)

    def generate(self, prompts, params: SamplingParams):
        right = [int(p.split()[0]) for p in prompts]
        return [[Sample("\\boxed{7}" if i < c else "\\boxed{0}", [1], "stop") for i in range(params.n)] for c in right]


@pytest.mark.parametrize("name, rewards_K", [("intrinsic", [0.25, 0.0]), ("intrinsic_4p1p", [0.5, 0.0]),
                                             ("intrinsic_min", [0.25, 0.0]), ("intrinsic_mixed", [0.5, 0.0])])
def test_intrinsic_rewards_are_functions_of_one_group_record(name, rewards_K):
    """R_k = the mean of ``QUESTION_REWARDS[name](s)`` over dataset k, s the base student's success rate on each
    question (0, 1/2 and 1 here); the generator is synced to the record's baseline once per group."""
    from omegaconf import OmegaConf

    from soar.data import Problem
    from soar.grading import make_grader
    from soar.rewards import GroupRecord, RewardState

    cfg = OmegaConf.create({"seed": 0, "student": {"max_tokens": 8, "stop": []}, "teacher": {"intrinsic_samples": 4}})
    state = RewardState(cfg, make_grader("integer"), "{question}", scorer=None, generator=RightOnCue())
    datasets_K = [[Problem("a", "0 of 4", "7"), Problem("b", "2 of 4", "7")], [Problem("c", "4 of 4", "7")]]
    progress = []
    bar = type("Bar", (), {"update": lambda self, n: progress.append(n)})()
    baseline = object()
    out = TEACHER_REWARDS[name].fn(GroupRecord(datasets_K, baseline, [], 0.0, 3, 1, 2, bar), state)
    assert out.rewards_KR.tolist() == [[r] for r in rewards_K] and out.students_KR == []
    assert out.metrics == {"teacher/intrinsic_success_rate": 0.5}
    assert state.generator.synced == [baseline] and progress == [1, 1]  # one unit per dataset


def test_teacher_reward_registry():
    """``teacher.reward`` names exactly the registered rewards; only ``grounded`` trains students, so only
    it may promote, and ``${student_tasks:}`` counts students for it alone."""
    assert list(TEACHER_REWARDS) == ["grounded", "intrinsic", "intrinsic_4p1p", "intrinsic_min", "intrinsic_mixed"]
    assert [name for name, reward in TEACHER_REWARDS.items() if reward.trains_students] == ["grounded"]


class ScriptedGenerator:
    """Returns fixed texts in order (a stand-in for a model, to pin the sampling bookkeeping)."""

    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    def generate(self, prompts, params: SamplingParams):
        self.calls.append(params)
        out = [self.texts.pop(0) if self.texts else "junk" for _ in range(params.n)]
        return [[Sample(t, [1, 2], "stop") for t in out]]


def parse(text):
    return Pair(text, "1") if text.startswith("ok") else Reject("no_tags")


@pytest.mark.parametrize("text, expected", [
    ("<question>1+2</question><answer>\\boxed{3}</answer>", Pair("1+2", "3")),
    ("<question>1+2<question> <answer>\\boxed{3}</answer>", Pair("1+2", "3")),  # the paper prompt's closer typo
    ("Plan: add.\n<question>1+2</question>\nso 3\n<answer>\\boxed{3}</answer> done", Pair("1+2", "3")),
    ("<question>1+2</question>x<question>5</question><answer>\\boxed{5}</answer>", Pair("5", "5")),
    ("<question>1</question><answer>\\boxed{1}</answer><question>2</question><answer>\\boxed{2}</answer>", Pair("1", "1")),
    ("<question>1+2</question>", Reject("no_tags")),
    ("<question> </question><answer>\\boxed{3}</answer>", Reject("empty_question")),
    ("<question>1+2</question><answer>3</answer>", Reject("no_box")),
    ("<question>1+2</question><answer>\\boxed{three}</answer>", Reject("unparseable_answer")),
    ("<question>1+2+3</question><answer>\\boxed{6}</answer>", Reject("question_too_long")),
])
def test_parse_pair_keeps_the_first_tagged_pair_and_ignores_text_outside_tags(text, expected):
    assert parse_pair(text, answer_ok=str.isdigit, max_question_chars=3) == expected


def test_rejection_sampling_keeps_first_valid_in_order_and_counts_rejects():
    gen = ScriptedGenerator(["ok1", "bad", "ok2", "bad", "ok3", "ok4", "ok5"])
    rollouts, m = sample_valid(gen, "P", 4, SamplingParams(), parse, batch=3, max_attempts=100, seed=0, step=7)
    assert [r.question for r in rollouts] == ["ok1", "ok2", "ok3", "ok4"]
    assert m["teacher/attempts"] == 6 and m["teacher/reject/no_tags"] == pytest.approx(2 / 6)
    assert m["teacher/valid_frac"] == pytest.approx(4 / 6)
    assert len(gen.calls) == 2 and gen.calls[0].seed != gen.calls[1].seed  # each round has its own seed


def test_rejection_sampling_cap_names_step_and_valid_fraction():
    gen = ScriptedGenerator(["ok"] + ["bad"] * 50)
    with pytest.raises(RejectionCapError, match=r"the teacher after 3 outer steps\): 1/10 completions valid \(10.0%\)"):
        sample_valid(gen, "P", 4, SamplingParams(), parse, batch=5, max_attempts=10, seed=0, step=3)


def test_diversity_metrics():
    e = np.eye(4)
    assert mean_pairwise_cosine_distance(e) == pytest.approx(1.0)
    assert vendi_score(e) == pytest.approx(4.0)
    same = np.ones((5, 3))
    assert mean_pairwise_cosine_distance(same) == pytest.approx(0.0, abs=1e-12)
    assert vendi_score(same) == pytest.approx(1.0)
    two = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], dtype=float)
    assert vendi_score(two) == pytest.approx(2.0)


def test_a_non_finite_loss_aborts_naming_step_and_phase():
    from soar.loop import LoopError, phase

    times = {}
    with pytest.raises(LoopError, match="outer step 8, phase teacher_update: non-finite teacher loss"):
        with phase("teacher_update", 7, times):
            raise FloatingPointError("non-finite teacher loss at its step 7")
    assert times == {}  # nothing recorded for the failed phase; the checkpoint comes later and is skipped
