"""Divergence guard, judged at boundaries from values the averaging collective already carries
(loss, drift and update norms, reduced over ranks), so every rank reaches the same verdict."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from controllers.base import BoundaryStats

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def params_finite(tensors) -> bool:
    """Whether every element is finite; one host sync. Each tensor's L1 norm in float64 is
    finite exactly when its elements are (NaN and inf propagate; |x| summed in float64 cannot
    overflow from any float32 or narrower values), and one foreach op does every tensor: 33
    against 58 µs on the cnn1d, 2.0 against 4.3 ms for 3M parameters (issue 17). Other dtypes
    (float64, complex, integer) are checked elementwise."""
    narrow, other = [], []
    for t in tensors:
        (narrow if t.dtype in _NARROW else other).append(t.detach())
    # float64 (its own sum could overflow), complex, integer: elementwise
    flags = [torch.isfinite(t).all() for t in other]
    if narrow:
        norms = torch._foreach_norm(narrow, 1, dtype=torch.float64)
        flags.append(torch.isfinite(torch.stack(norms)).all())
    return not flags or bool(torch.stack(flags).all())


class Diverged(RuntimeError):
    """Training diverged and the run stops (or has no checkpoint to roll back to)."""


class Rollback(Exception):
    def __init__(self, reason: str, sync_period: int) -> None:
        super().__init__(reason)
        self.reason, self.sync_period = reason, sync_period


def diverged(window_loss: float, best_window_loss: float, factor: float) -> bool:
    return math.isfinite(best_window_loss) and window_loss > factor * best_window_loss


@dataclass
class DivergenceGuard:
    factor: float = 4.0  # window loss this many times its running minimum: diverged
    window: int = 4
    # ddp's loss is rank-local (no averaging collective reduces it): judging it would trip the
    # guard on one rank a boundary before the others and pair the ranks' collectives wrongly.
    # There the caller passes the finiteness of the parameters, identical on every rank.
    shared_loss: bool = True
    best: float = math.inf
    _recent: deque = field(default_factory=deque)

    def check(self, s: BoundaryStats, params_finite: bool = True) -> str | None:
        """Why training diverged at this boundary, or None. Judges only values every rank
        holds alike, so every rank reaches the same verdict at the same boundary."""
        if not params_finite:
            return f"non-finite parameters at boundary {s.boundary}"
        values = (s.drift_norm, s.update_norm) + ((s.train_loss,) if self.shared_loss else ())
        if not all(math.isfinite(v) for v in values):
            return (
                f"non-finite values at boundary {s.boundary} (loss {s.train_loss}, drift "
                f"{s.drift_norm}, update {s.update_norm})"
            )
        if not self.shared_loss:
            return None
        self._recent.append(s.train_loss)
        if len(self._recent) > self.window:
            self._recent.popleft()
        if len(self._recent) < self.window:
            return None
        mean = sum(self._recent) / len(self._recent)
        if diverged(mean, self.best, self.factor):
            return (
                f"loss {mean:.4g} over the last {self.window} boundaries is more than "
                f"{self.factor:g}x its running minimum {self.best:.4g} (boundary {s.boundary})"
            )
        self.best = min(self.best, mean)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]
        self._recent = deque(state["recent"])
