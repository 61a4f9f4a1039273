"""`post-local`: post-local SGD (Lin, Stich, Patel & Jaggi, "Don't Use Large Mini-Batches, Use
Local SGD", ICLR 2020): K = 1 (every step synchronized, as DDP) until the first learning-rate
decay, then a fixed K (`--sync-period`) for the rest of the run.

The decay is detected at a boundary after warmup: the LR in force has fallen below the largest
LR seen so far by more than a relative DECAY (1%). Against the running peak, not the previous
boundary's LR, so a slow cosine decay also switches once it has decayed 1% (a step schedule
switches at its first milestone, as in the paper); a rising warmup LR never switches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision

DECAY = 0.01


def decayed(lr: float, peak_lr: float) -> bool:
    return lr < peak_lr * (1.0 - DECAY)


@dataclass
class PostLocalController:
    local_period: int  # K after the switch
    max_sync_period: int = 64
    sync_period: int = 1
    peak_lr: float = 0.0
    switched: bool = False

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        self.peak_lr = max(self.peak_lr, stats.lr)
        if not self.switched and not stats.warmup and decayed(stats.lr, self.peak_lr):
            self.switched = True
            self.sync_period = min(self.local_period, self.max_sync_period)
            return SyncDecision(self.sync_period, f"post-local: LR decayed to {stats.lr:.3g}")
        if self.switched:
            return SyncDecision(self.sync_period, "post-local: local phase")
        return SyncDecision(1, "post-local: K = 1 until the first LR decay")

    def rollback(self, sync_period: int) -> None:
        """After a divergence rollback the local phase runs at the halved K."""
        self.sync_period = sync_period
        self.max_sync_period = max(1, sync_period)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sync_period": self.sync_period,
            "max_sync_period": self.max_sync_period,
            "peak_lr": self.peak_lr,
            "switched": self.switched,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.max_sync_period = int(state["max_sync_period"])
        self.peak_lr = float(state["peak_lr"])
        self.switched = bool(state["switched"])
