"""Credit assignment for a team of roles: pure functions from a step's episodes and trained actions to each
action's per-token advantages, chosen by ``team.credit`` (``CREDITS``). No model and no state: the tests pin
each by hand (``tests/test_team_credit.py``).

An *episode* is one run of the chain on one problem; a problem's ``student.group_size`` episodes are its
*group*. An *action* is one trained role's completion in one episode. Every function returns, per action,
its scalar reward (``rewards``, what "groups with no signal" is read from) and one advantage per completion
token (``token_adv``, what ``RLOOTrainer.update`` weighs each token's log-probability by).

- ``shared_outcome`` (recipe A): an episode's reward is 1 if its final answer is right, plus ``fix_bonus``
  when a wrong first attempt was made right; centred on its group's mean (GRPO without the std), and that
  advantage is every one of the episode's trained tokens'.
- ``outcome_only`` and ``process`` (MAPPA): each action is its own sample. Its reward, on its last token, is
  the final answer's correctness (``outcome_only``) or the process coach's score / 10 plus
  ``outcome_weight`` x correctness (``process``); every token also earns ``-kl_coef x KL_t`` (the per-token
  KL estimate ``log pi - log pi_ref`` of the sampled token); each token's advantage is its return-to-go
  (discount ``gamma``) normalised over all tokens of its agent's actions in the step (REINFORCE++ per
  agent: population std, ``NORM_EPS``).
- ``coach_delta``: the critique role's action is credited with the final answer's correctness given its
  critique minus that of a sibling revision of the same attempt without it; the other roles get
  ``shared_outcome``'s advantage.

A leaked action (its text carried the gold answer, ``soar.leak``) earns 0 in every function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

NORM_EPS = 1e-8
"""Added to the std of per-agent normalisation (OpenRLHF's REINFORCE++)."""


@dataclass(frozen=True)
class EpisodeRecord:
    group: int
    """The problem's index in the step: episodes of one group share their problem."""
    first_correct: bool
    """The chain's first graded role was right (the first attempt)."""
    final_correct: bool
    """The chain's last graded role was right (the final answer)."""
    without_critique_correct: bool | None = None
    """``coach_delta``: the sibling revision without the critique was right."""


@dataclass(frozen=True)
class ActionRecord:
    episode: int
    """Index into the step's episodes."""
    role: str
    agent: str
    """The policy that wrote it (per-agent normalisation)."""
    tokens: int
    """Its completion's token count (EOS included)."""
    score: float | None = None
    """The process coach's score, 0-10 (``process``)."""
    leaked: bool = False
    """Its text carried the gold answer: it earns 0."""


@dataclass(frozen=True)
class CreditParams:
    fix_bonus: float = 0.1
    kl_coef: float = 0.01
    gamma: float = 1.0
    outcome_weight: float = 0.0
    coach_role: str | None = None


@dataclass
class CreditResult:
    rewards: list[float]
    """Per action: its scalar reward before any baseline."""
    token_adv: list[list[float]]
    """Per action: one advantage per completion token."""


@dataclass(frozen=True)
class Credit:
    fn: Callable[..., CreditResult]
    needs_kl: bool = False
    """Reads the per-token KL (the stage computes it before the update)."""
    needs_scores: bool = False
    """Reads the process coach's scores (``team.scorer``)."""
    needs_sibling: bool = False
    """Reads ``without_critique_correct`` (the stage generates the sibling revision)."""


def episode_rewards(episodes: list[EpisodeRecord], fix_bonus: float) -> list[float]:
    """Recipe A's reward of each episode: 1 if the final answer is right, + ``fix_bonus`` if the first was wrong."""
    return [float(e.final_correct) + fix_bonus * float(e.final_correct and not e.first_correct) for e in episodes]


def group_means(episodes: list[EpisodeRecord], values: list[float]) -> dict[int, float]:
    groups: dict[int, list[float]] = {}
    for e, v in zip(episodes, values):
        groups.setdefault(e.group, []).append(v)
    return {g: float(np.mean(vs)) for g, vs in groups.items()}


def shared_outcome(episodes, actions, kl, p: CreditParams) -> CreditResult:
    r_E = episode_rewards(episodes, p.fix_bonus)
    group_mean = group_means(episodes, r_E)
    rewards = [0.0 if a.leaked else r_E[a.episode] for a in actions]
    adv = [r - group_mean[episodes[a.episode].group] for a, r in zip(actions, rewards)]
    return CreditResult(rewards, [[x] * a.tokens for a, x in zip(actions, adv)])


def returns_to_go(final_reward: float, kl_T: list[float], kl_coef: float, gamma: float) -> list[float]:
    """Per token: the discounted sum of the rewards from it on, each token earning ``-kl_coef * kl_t`` and
    the last also ``final_reward``."""
    out, running = [0.0] * len(kl_T), 0.0
    for t in range(len(kl_T) - 1, -1, -1):
        running = -kl_coef * kl_T[t] + (final_reward if t == len(kl_T) - 1 else 0.0) + gamma * running
        out[t] = running
    return out


def per_agent_normalised(actions, values: list[list[float]]) -> list[list[float]]:
    """Each token's value minus the mean over every token of its agent's actions, over their std (population)."""
    by_agent: dict[str, list[float]] = {}
    for a, v in zip(actions, values):
        by_agent.setdefault(a.agent, []).extend(v)
    stats = {k: (float(np.mean(v)), float(np.std(v))) for k, v in by_agent.items() if v}
    return [[(x - stats[a.agent][0]) / (stats[a.agent][1] + NORM_EPS) for x in v] for a, v in zip(actions, values)]


def _action_returns(actions, kl, rewards: list[float], p: CreditParams) -> CreditResult:
    values = [returns_to_go(r, k if k is not None else [0.0] * a.tokens, p.kl_coef, p.gamma)
              for a, r, k in zip(actions, rewards, kl)]
    return CreditResult(rewards, per_agent_normalised(actions, values))


def outcome_only(episodes, actions, kl, p: CreditParams) -> CreditResult:
    rewards = [0.0 if a.leaked else float(episodes[a.episode].final_correct) for a in actions]
    return _action_returns(actions, kl, rewards, p)


def process(episodes, actions, kl, p: CreditParams) -> CreditResult:
    missing = [a.role for a in actions if a.score is None and not a.leaked]
    if missing:
        raise ValueError(f"process credit: actions of {sorted(set(missing))} have no score (team.scorer.roles)")
    rewards = [0.0 if a.leaked else a.score / 10 + p.outcome_weight * float(episodes[a.episode].final_correct)
               for a in actions]
    return _action_returns(actions, kl, rewards, p)


def coach_delta(episodes, actions, kl, p: CreditParams) -> CreditResult:
    if p.coach_role is None:
        raise ValueError("coach_delta credit needs team.coach_role")
    shared = shared_outcome(episodes, actions, kl, p)
    rewards, token_adv = list(shared.rewards), list(shared.token_adv)
    for i, a in enumerate(actions):
        if a.role != p.coach_role:
            continue
        e = episodes[a.episode]
        if e.without_critique_correct is None:
            raise ValueError(f"coach_delta credit: episode {a.episode} has no sibling revision without the critique")
        rewards[i] = 0.0 if a.leaked else float(e.final_correct)
        token_adv[i] = [rewards[i] - float(e.without_critique_correct)] * a.tokens
    return CreditResult(rewards, token_adv)


CREDITS: dict[str, Credit] = {
    "shared_outcome": Credit(shared_outcome),
    "outcome_only": Credit(outcome_only, needs_kl=True),
    "process": Credit(process, needs_kl=True, needs_scores=True),
    "coach_delta": Credit(coach_delta, needs_sibling=True),
}
"""``team.credit`` -> its function and what it reads."""


def assign(name: str, episodes: list[EpisodeRecord], actions: list[ActionRecord],
           kl: list[list[float] | None] | None, params: CreditParams) -> CreditResult:
    """``CREDITS[name]`` on a step; ``kl`` per action (None: no KL term)."""
    kl = kl if kl is not None else [None] * len(actions)
    out = CREDITS[name].fn(episodes, actions, kl, params)
    bad = [i for i, (a, v) in enumerate(zip(actions, out.token_adv)) if len(v) != a.tokens]
    if bad:
        raise AssertionError(f"credit {name}: actions {bad} got the wrong number of token advantages")
    return out


def groups_without_signal(episodes: list[EpisodeRecord], actions: list[ActionRecord], rewards: list[float]
                          ) -> dict[str, float]:
    """Per role: the share of groups whose actions of that role all earned the same reward (nothing to tell
    them apart by); groups holding one such action count as without signal."""
    by_role: dict[str, dict[int, list[float]]] = {}
    for a, r in zip(actions, rewards):
        by_role.setdefault(a.role, {}).setdefault(episodes[a.episode].group, []).append(r)
    return {role: float(np.mean([max(rs) - min(rs) < 1e-12 for rs in groups.values()]))
            for role, groups in by_role.items()}
