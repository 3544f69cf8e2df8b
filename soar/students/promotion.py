"""Promotion (paper §1.4): when the moving average of the per-step mean reward passes tau, the
median student of the best dataset becomes the new baseline and that dataset joins the Promotion
Questions. Pure and stateful only through ``history``, so the tests pin every rule by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def closest_to_median(rewards_R, tol: float = 1e-9) -> list[int]:
    """Indices of the replicates closest to the median of ``rewards_R`` (within ``tol``)."""
    r = np.asarray(rewards_R, dtype=float)
    dist = np.abs(r - float(np.median(r)))
    return [j for j in range(len(r)) if dist[j] <= dist.min() + tol]


def median_replicate(rewards_R) -> int:
    """Index of the median replicate. Odd r: the middle value. Even r: the replicate closest to the
    mean of the two middle values. Ties: lower reward, then lower index."""
    r = np.asarray(rewards_R, dtype=float)
    return min(closest_to_median(r), key=lambda j: (r[j], j))  # 1e-9: float-exact ties


CANDIDATE_TOL = 1e-6
"""Slack of ``promotion_candidates``: rewards are scores minus the baseline's, so a near-tie of scores
may break either way once the baseline is subtracted; such students are kept."""


def promotion_candidates(scores_KR: list[list[float]], replicates: int) -> set[tuple[int, int]]:
    """(k, j) of a group's students that may still be promoted or dumped (the median replicate of the
    best dataset), from the scores known so far: row k holds dataset k's replicate scores in order,
    fewer than ``replicates`` while it trains. A dataset still training keeps all its students; of the
    finished ones only those tied with the best mean keep their (tied) median replicates. Scores may
    be the rewards or the scores they are computed from (rewards = scores - the baseline's score)."""
    keep = {(k, j) for k, row in enumerate(scores_KR) if len(row) < replicates for j in range(len(row))}
    done = {k: row for k, row in enumerate(scores_KR) if len(row) == replicates}
    if done:
        best = max(float(np.mean(row)) for row in done.values())
        for k, row in done.items():
            if float(np.mean(row)) >= best - CANDIDATE_TOL:
                keep |= {(k, j) for j in closest_to_median(row, CANDIDATE_TOL)}
    return keep


@dataclass
class Decision:
    promote: bool
    step_reward: float
    """R̂_t: mean of R_k over this step's datasets."""
    moving_average: float | None
    """Mean of the last ``window`` step rewards including this one; None on a partial window."""
    dataset: int | None = None
    """k*: argmax_k R_k (ties: lower index)."""
    replicate: int | None = None
    """j*: the median replicate of dataset k*."""
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class PromotionPolicy:
    def __init__(self, cfg, history: list[float] | None = None):
        self.cfg = cfg
        self.history: list[float] = list(history or [])

    def update(self, rewards_KR) -> Decision:
        """Record this step's rewards (datasets x replicates) and decide."""
        rewards_KR = np.asarray(rewards_KR, dtype=float)
        rewards_K = rewards_KR.mean(-1)
        step_reward = float(rewards_K.mean())
        self.history.append(step_reward)
        w, tau = self.cfg.window, self.cfg.tau
        if len(self.history) < w:
            return Decision(False, step_reward, None, reason=f"partial window ({len(self.history)}/{w} steps)")
        ma = float(np.mean(self.history[-w:]))
        if not self.cfg.enabled:
            return Decision(False, step_reward, ma, reason="promotion disabled")
        if ma <= tau:
            return Decision(False, step_reward, ma, reason=f"moving average {ma:.4f} <= tau {tau}")
        k = int(np.argmax(rewards_K))  # first maximum: ties go to the lower index
        j = median_replicate(rewards_KR[k])
        if self.cfg.reset_window:
            self.history.clear()
        return Decision(True, step_reward, ma, k, j,
                        reason=f"moving average {ma:.4f} > tau {tau}; best dataset {k} (R={rewards_K[k]:.4f}), "
                               f"median replicate {j} (R={rewards_KR[k, j]:.4f})")

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
