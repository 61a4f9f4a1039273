"""`qsr`: the Quadratic Synchronization Rule (Gu et al., 2023), K ∝ η⁻² as the LR decays.

    K = max(K_base, floor((α/η)²))

with η the LR in force. The default α = peak LR · sqrt(K_base) makes K = K_base at the peak LR,
so K starts to grow as soon as the LR decays from its peak. K_base during warmup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision


def next_sync_period(lr: float, *, base: int, alpha: float, max_k: int) -> int:
    return lr_power_period(lr, base=base, alpha=alpha, max_k=max_k, power=2)


def lr_power_period(lr: float, *, base: int, alpha: float, max_k: int, power: int) -> int:
    """K = max(K_base, floor((α/η)^power)), capped: QSR's power 2 and the 1/η rule's power 1
    (controllers/inverse_lr.py) read the LR the same way."""
    if lr <= 0:
        return max_k
    ratio = alpha / lr
    if not ratio <= 1e150:  # its square would overflow (or it is NaN: no period to compute)
        return max(base, max_k)
    return max(base, min(max_k, math.floor(ratio**power)))


def default_alpha(peak_lr: float, base: int) -> float:
    return peak_lr * math.sqrt(base)


class LRDrivenPeriod:
    """What an LR-driven rule (QSR, inverse-lr) keeps besides its formula: K, its cap, and how a
    rollback lowers the cap. The rule's own dataclass declares base, max_sync_period and
    sync_period."""

    base: int
    max_sync_period: int
    sync_period: int

    def rollback(self, sync_period: int) -> None:
        """After a divergence rollback the LR-driven K may not exceed the halved K."""
        self.sync_period = sync_period
        self.max_sync_period = max(self.base, sync_period)

    def state_dict(self) -> dict[str, Any]:
        return {"sync_period": self.sync_period, "max_sync_period": self.max_sync_period}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.max_sync_period = int(state["max_sync_period"])


@dataclass
class QSRController(LRDrivenPeriod):
    base: int
    alpha: float
    max_sync_period: int = 64
    sync_period: int = 0

    def __post_init__(self) -> None:
        self.sync_period = self.sync_period or self.base

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        if stats.warmup:
            self.sync_period = self.base
            return SyncDecision(self.base, "warmup: K_base")
        k = next_sync_period(stats.lr, base=self.base, alpha=self.alpha, max_k=self.max_sync_period)
        self.sync_period = k
        return SyncDecision(k, f"qsr: (alpha/lr)^2 = ({self.alpha:.3g}/{stats.lr:.3g})^2")
