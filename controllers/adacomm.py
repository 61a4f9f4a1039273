"""`adacomm`: loss-adaptive K (Wang & Joshi, AdaComm): K = ceil(sqrt(F / F_0) · K_0).

Starts at K_0 and shrinks as the training loss F falls below its first post-warmup level F_0:
communicate rarely while far from a minimum, more often near it. F is the mean loss over a
window of boundaries, and K is recomputed once per window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from controllers.base import BoundaryStats, SyncDecision


def next_sync_period(loss: float, initial_loss: float, k0: int, *, max_k: int) -> int:
    if not (math.isfinite(loss) and initial_loss > 0):
        return 1
    return max(1, min(max_k, math.ceil(math.sqrt(loss / initial_loss) * k0)))


@dataclass
class AdaCommController:
    k0: int
    window: int = 4
    max_sync_period: int = 64
    sync_period: int = 0
    initial_loss: float | None = None
    _sum: float = 0.0
    _n: int = 0

    def __post_init__(self) -> None:
        self.sync_period = self.sync_period or self.k0

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        if stats.warmup:
            return SyncDecision(self.sync_period, "warmup")
        self._sum += stats.train_loss
        self._n += 1
        if self._n < self.window:
            return SyncDecision(self.sync_period, f"measuring ({self._n}/{self.window})")
        loss, self._sum, self._n = self._sum / self._n, 0.0, 0
        if self.initial_loss is None:
            self.initial_loss = loss
        k = next_sync_period(loss, self.initial_loss, self.k0, max_k=self.max_sync_period)
        self.sync_period = k
        return SyncDecision(k, f"adacomm: sqrt({loss:.4g}/{self.initial_loss:.4g}) x {self.k0}")

    def rollback(self, sync_period: int) -> None:
        self.sync_period = sync_period
        self.max_sync_period = sync_period

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync_period": self.sync_period,
            "initial_loss": self.initial_loss,
            "sum": self._sum,
            "n": self._n,
            "max_sync_period": self.max_sync_period,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.initial_loss = state["initial_loss"]
        self._sum, self._n = float(state["sum"]), int(state["n"])
        self.max_sync_period = int(state["max_sync_period"])
