"""`adacomm`: AdaComm (Wang & Joshi, "Adaptive Communication Strategies to Achieve the Best
Error-Runtime Trade-off in Local-Update SGD", SysML 2019), in the paper's form:

    K_l = ceil( sqrt( (η_0 · F_l) / (η_l · F_0) ) · K_0 )

K_0 is the paper's τ_0, a LARGE starting period (here `--max-sync-period`): communicate rarely
while far from a minimum, and shrink K as the training loss F falls below its first post-warmup
level F_0. η_l / η_0 is the LR in force over the LR at F_0 (the paper's learning-rate variant):
a decayed LR lowers the error floor of local updates, so K may grow back. With a constant LR the
factor is 1 and the rule is the paper's plain one. F_l is the mean loss over a window of
`--sync-window` boundaries; K is recomputed once per window (the paper's interval T_0, counted
in boundaries rather than wall-clock seconds, so every rank decides on the same numbers). With
`--fragments F` the window counts rounds (`BoundaryStats.closes_round`), not fragment boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision

STATE_VERSION = 2  # 2: K_0 is the large start and η_0 is kept; 1 (no key): no LR factor


def next_sync_period(
    loss: float,
    initial_loss: float,
    k0: int,
    *,
    max_k: int,
    lr: float = 1.0,
    initial_lr: float = 1.0,
) -> int:
    """The paper's τ_l; 1 (synchronize every step) when the inputs give no period."""
    if not (math.isfinite(loss) and initial_loss > 0 and lr > 0 and initial_lr > 0):
        return 1
    scale = (initial_lr * loss) / (lr * initial_loss)
    if not scale <= 1e300:  # overflow or NaN: the cap is the answer for a vanishing LR
        return max_k
    return max(1, min(max_k, math.ceil(math.sqrt(scale) * k0)))


@dataclass
class AdaCommController:
    k0: int
    window: int = 4
    max_sync_period: int = 64
    sync_period: int = 0
    initial_loss: float | None = None
    initial_lr: float | None = None
    _sum: float = 0.0
    _n: int = 0  # boundaries in the window, for the mean
    _rounds: int = 0  # rounds closed in the window: its length

    def __post_init__(self) -> None:
        self.sync_period = self.sync_period or self.k0

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        if stats.warmup:
            return SyncDecision(self.sync_period, "warmup")
        self._sum += stats.train_loss
        self._n += 1
        self._rounds += stats.closes_round
        if self._rounds < self.window:
            return SyncDecision(self.sync_period, f"measuring ({self._rounds}/{self.window})")
        loss, self._sum, self._n, self._rounds = self._sum / self._n, 0.0, 0, 0
        if self.initial_loss is None:
            self.initial_loss = loss
        if self.initial_lr is None:
            self.initial_lr = stats.lr
        k = next_sync_period(
            loss,
            self.initial_loss,
            self.k0,
            max_k=self.max_sync_period,
            lr=stats.lr,
            initial_lr=self.initial_lr,
        )
        self.sync_period = k
        return SyncDecision(
            k,
            f"adacomm: sqrt({self.initial_lr:.3g}*{loss:.4g}/({stats.lr:.3g}*"
            f"{self.initial_loss:.4g})) x {self.k0}",
        )

    def rollback(self, sync_period: int) -> None:
        self.sync_period = sync_period
        self.max_sync_period = sync_period

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "sync_period": self.sync_period,
            "initial_loss": self.initial_loss,
            "initial_lr": self.initial_lr,
            "sum": self._sum,
            "n": self._n,
            "rounds": self._rounds,
            "max_sync_period": self.max_sync_period,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
        self.initial_loss = state["initial_loss"]
        # A version-1 state has no η_0: the next window's LR becomes it (the LR factor counts
        # from the resume on; the loss factor still from the first window)
        self.initial_lr = state.get("initial_lr")
        self._sum, self._n = float(state["sum"]), int(state["n"])
        self._rounds = int(state.get("rounds", self._n))  # saved before rounds: one a boundary
        self.max_sync_period = int(state["max_sync_period"])
