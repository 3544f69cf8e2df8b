"""Promotion (paper §1.4): when the moving average of the per-step mean reward passes tau, the
median student of the best dataset becomes the new baseline and that dataset joins the Promotion
Questions. Pure and stateful only through ``history``, so the tests pin every rule by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def median_replicate(rewards_R) -> int:
    """Index of the median replicate. Odd r: the middle value. Even r: the replicate closest to the
    mean of the two middle values. Ties: lower reward, then lower index."""
    r = np.asarray(rewards_R, dtype=float)
    dist = np.abs(r - float(np.median(r)))
    closest = [j for j in range(len(r)) if dist[j] <= dist.min() + 1e-9]  # float-exact ties
    return min(closest, key=lambda j: (r[j], j))


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
