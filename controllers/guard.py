"""The drift and loss guard shared by `exposed-sync` and `composite`: pure rules + a small tracker.

The guard fires when the window's mean drift ratio (docs/design.md §4) exceeds `drift_limit` times
its level calibrated over the first post-warmup window, or when the window's mean training loss
exceeds (1 + loss_rise) times the best window mean seen so far (exposed-sync starts the best
afresh after a raise of K: controllers/exposed_sync.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def drift_fired(window_drift_ratio: float, calibrated: float | None, limit: float) -> bool:
    return calibrated is not None and calibrated > 0 and window_drift_ratio > limit * calibrated


def loss_fired(window_loss: float, best_window_loss: float, rise: float) -> bool:
    if not math.isfinite(window_loss):
        return True
    return math.isfinite(best_window_loss) and window_loss > (1.0 + rise) * best_window_loss


@dataclass
class Guard:
    drift_limit: float = 3.0
    loss_rise: float = 0.1
    calibrated_drift: float | None = None
    best_loss: float = math.inf

    def check(self, window_drift_ratio: float, window_loss: float) -> str | None:
        """Judge one completed window; return why the guard fired, or None."""
        if self.calibrated_drift is None:
            self.calibrated_drift = window_drift_ratio
        if drift_fired(window_drift_ratio, self.calibrated_drift, self.drift_limit):
            return (
                f"drift ratio {window_drift_ratio:.3g} > {self.drift_limit:g} x calibrated "
                f"{self.calibrated_drift:.3g}"
            )
        if loss_fired(window_loss, self.best_loss, self.loss_rise):
            return f"loss {window_loss:.4g} rose over best window {self.best_loss:.4g}"
        self.best_loss = min(self.best_loss, window_loss)
        return None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
