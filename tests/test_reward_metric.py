"""``inner.reward_metric=gold_prob``: Q_R correctness as the exact probability that a T=1 sample
starts with the gold answer, checked against real sampling on the tiny world model and in the loop."""

import json

import numpy as np
import pytest
from test_loop import comparable_metrics, micro_args

from conftest import ARITH_TEMPLATE, run_cli

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from soar.models import load_model, load_tokenizer

    mcfg = type("M", (), {"path": str(tiny_model_dir), "revision": None, "dtype": "float32", "trust_remote_code": False})
    return load_model(mcfg), load_tokenizer(mcfg)


def test_each_reward_metric_reads_only_what_it_declares():
    """A metric is a function of what a scorer measures: ``accuracy`` the graded answers, the gold metrics the
    gold log-probabilities (``gold_prob`` their exp, in the log-probs' own arithmetic); reading the other is an
    error here, so ``reads_gold`` (what validation checks) is what each metric does."""
    import torch

    from soar.policy.scores import REWARD_METRICS, Measures, score

    def unread():
        raise AssertionError("read what the metric does not declare")

    def measures(reads_gold, logprobs):
        return Measures(unread, lambda: logprobs) if reads_gold else Measures(lambda: [1.0, 0.0], unread)

    expected = {"accuracy": [1.0, 0.0], "gold_prob": [1.0, float(np.exp(-1.0))], "gold_logprob": [0.0, -1.0]}
    assert set(REWARD_METRICS) == set(expected)
    for name, metric in REWARD_METRICS.items():
        assert score(name, measures(metric.reads_gold, [0.0, -1.0])) == expected[name]
        if metric.bounded:  # scores in [0, 1] whatever the log-probs
            assert all(0 <= x <= 1 for x in score(name, measures(metric.reads_gold, [-50.0, 0.0])))
    logprobs_SM = torch.tensor([[0.0, -1.0]])  # a stack's measures: float32, one row per student
    assert score("gold_prob", Measures(unread, lambda: logprobs_SM)) == logprobs_SM.exp().tolist()


@pytest.mark.slow
def test_gold_prob_is_the_sampled_frequency_of_the_gold_answer(tiny):
    """exp(log p(gold)) equals how often T=1 samples begin with exactly ``\\boxed{gold}`` (within
    4 binomial standard errors over 2000 samples), for problems of 0-3 carries."""
    from soar.generation import HFGenerator, SamplingParams
    from soar.policy.scores import gold_measures, score
    from soar.worlds.arith import generate_problems

    model, tok = tiny
    problems = [generate_problems(3, c, 1, seed=40 + c, prefix="g")[0] for c in range(4)]
    probs = score("gold_prob", gold_measures(model, tok, problems, ARITH_TEMPLATE, "\\boxed{{answer}}", None))
    n = 2000
    outs = HFGenerator(model, tok, batch_size=2000).generate(
        [ARITH_TEMPLATE.replace("{question}", p.question) for p in problems],
        SamplingParams(n=n, temperature=1.0, max_tokens=16, seed=3))
    for p, prob, samples in zip(problems, probs, outs):
        freq = np.mean([s.text.startswith(f"\\boxed{{{p.answer}}}") for s in samples])
        se = np.sqrt(max(prob * (1 - prob), 1e-4) / n)
        assert abs(freq - prob) < 4 * se, (p.question, p.answer, prob, freq)
    assert max(probs) - min(probs) > 0.1  # the problems differ: the check above is not trivially met


def test_gold_logprobs_do_not_depend_on_batching(tiny):
    """Right padding in a batch leaves every problem's log-probability unchanged."""
    from soar.policy.scores import gold_logprobs
    from soar.worlds.arith import generate_problems

    model, tok = tiny
    from dataclasses import replace

    problems = generate_problems(3, 1, 6, seed=9, prefix="b")
    problems[2] = replace(problems[2], answer="12")  # a shorter gold completion: padded in the batch
    batched = gold_logprobs(model, tok, problems, ARITH_TEMPLATE, "\\boxed{{answer}}", batch_size=6)
    single = [gold_logprobs(model, tok, [p], ARITH_TEMPLATE, "\\boxed{{answer}}")[0] for p in problems]
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert all(lp < 0 for lp in batched)


def test_loop_with_gold_logprob_rewards(tiny, tiny_model_dir, tmp_path):
    """Under ``gold_logprob`` the baseline's Q_R score is the base model's mean gold log-probability on
    the step's Q_R (recomputed here), R_k is the replicates' mean, and accuracies stay accuracies."""
    from soar.data import Problem
    from soar.loop import draw_reward_questions
    from soar.policy.scores import gold_logprobs
    from soar.seeding import derive_seed

    run_dir = tmp_path / "gold"
    run_cli(micro_args(tiny_model_dir, run_dir, "loop.steps=2", "inner.reward_metric=gold_logprob",
                       "loop.diversity_model=null"))
    rows = comparable_metrics(run_dir)
    hard_train = [Problem(r["id"], r["question"], r["answer"]) for r in
                  map(json.loads, (run_dir / "hard_set" / "hard_train.jsonl").read_text().splitlines())]
    qr = [hard_train[i] for i in draw_reward_questions(len(hard_train), 8, derive_seed(0, "reward_questions", 0))]
    model, tok = tiny
    expected = np.mean(gold_logprobs(model, tok, qr, ARITH_TEMPLATE, "\\boxed{{answer}}"))
    assert rows[0]["student/base_acc_qr"] == pytest.approx(expected, abs=1e-4) and expected < 0
    for step in (1, 2):
        dump = json.loads((run_dir / "steps" / f"step_{step:06d}.json").read_text())
        for d in dump["datasets"]:
            assert d["reward"] == pytest.approx(np.mean(d["replicate_rewards"]))
        assert rows[step - 1]["teacher/reward_mean"] == pytest.approx(np.mean([d["reward"] for d in dump["datasets"]]))
        assert 0 <= rows[step - 1]["promotion/baseline_hard_train_acc"] <= 1
        assert rows[step - 1]["promotion/baseline_hard_train_score"] < 0
    record = json.loads((run_dir / "promotions.jsonl").read_text().splitlines()[0])  # tau=-1: promoted at step 2
    assert 0 <= record["hard_train_acc"] <= 1 and 0 <= record["hard_test_acc"] <= 1 and record["hard_train_score"] < 0


def test_unknown_reward_metric_is_a_config_error():
    import soar

    with pytest.raises(soar.ConfigError, match="inner.reward_metric"):
        soar.validate(soar.compose(["experiment=arith_micro", "model.path=/tmp", "inner.reward_metric=loss"]), "train")
