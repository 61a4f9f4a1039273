"""`inverse-lr`: K ∝ 1/η, the linear rule beside QSR's K ∝ 1/η² (STL-SGD's form: the period grows
as the learning rate decays, in proportion to its inverse).

    K = max(K_base, floor(α/η)),  α = peak LR · K_base

so K = K_base (`--sync-period`) at the peak LR and doubles each time the LR halves, capped by
`--max-sync-period`. The LR is read as QSR reads it (controllers/qsr.py); K_base in warmup.
"""

from __future__ import annotations

from dataclasses import dataclass

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.controllers.qsr import LRDrivenPeriod, lr_power_period


def next_sync_period(lr: float, *, base: int, peak_lr: float, max_k: int) -> int:
    return lr_power_period(lr, base=base, alpha=peak_lr * base, max_k=max_k, power=1)


@dataclass
class InverseLRController(LRDrivenPeriod):
    base: int
    peak_lr: float
    max_sync_period: int = 64
    sync_period: int = 0

    def __post_init__(self) -> None:
        self.sync_period = self.sync_period or self.base

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        if stats.warmup:
            self.sync_period = self.base
            return SyncDecision(self.base, "warmup: K_base")
        k = next_sync_period(
            stats.lr, base=self.base, peak_lr=self.peak_lr, max_k=self.max_sync_period
        )
        self.sync_period = k
        return SyncDecision(k, f"inverse-lr: {self.base} x {self.peak_lr:.3g}/{stats.lr:.3g}")
