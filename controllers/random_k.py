"""`random`: K drawn afresh at every boundary from a seeded distribution of a given mean.

The honest baseline for "the controller is smart" (WA-DiLoCo found its online policy tied with a
random deferral of matched mean): a controller earns its keep only if it beats K chosen at
random with the same mean, i.e. with the same number of synchronizations per step. The panel's
"matched random" arm is this policy with its mean set per seed to the mean K (after warmup) that
the adaptive arm used on the same seed (`random_mean: {mean_k_of: ...}` in an experiment,
autok/experiment.py `with_matched_mean`), capped by `--max-sync-period`.

    U ~ Uniform(m − w, m + w),  w = min(m − 1, K_max − m);  K = floor(U) + Bernoulli(frac(U))

Stochastic rounding keeps E[K] = m exactly (also for a non-integer m, such as the mean K another
policy used), and K stays in [1, K_max]. Every rank seeds the same generator, so every rank draws
the same K without a collective.
"""

from __future__ import annotations

import math
import random
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision


def draw(rng: random.Random, mean: float, max_k: int) -> int:
    """One K with E[K] = mean (mean clamped to [1, max_k])."""
    m = min(max(1.0, mean), float(max_k))
    w = min(m - 1.0, max_k - m)
    u = rng.uniform(m - w, m + w)
    k = math.floor(u)
    if rng.random() < u - k:
        k += 1
    return max(1, min(max_k, k))


class RandomController:
    def __init__(self, mean: float, max_sync_period: int, seed: int) -> None:
        self.mean = float(mean)
        self.max_sync_period = max_sync_period
        self._rng = random.Random(f"autok-random-k-{seed}")
        self.sync_period = max(1, min(max_sync_period, round(self.mean)))

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        # Drawn in warmup too (where K is 1 anyway), so the first interval after it is a draw.
        self.sync_period = draw(self._rng, self.mean, self.max_sync_period)
        return SyncDecision(self.sync_period, f"random: drawn with mean {self.mean:.3g}")

    def rollback(self, sync_period: int) -> None:
        """After a divergence rollback: the halved K is the new cap of the draws."""
        self.sync_period = sync_period
        self.max_sync_period = max(1, sync_period)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync_period": self.sync_period,
            "max_sync_period": self.max_sync_period,
            "rng": self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.max_sync_period = int(state["max_sync_period"])
        rng = state["rng"]
        self._rng.setstate((rng[0], tuple(rng[1]), rng[2]))
