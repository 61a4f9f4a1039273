"""A K controller's window of boundaries: the sums of their measured times, drift and loss, each
closed round's network seconds (the level a changed link is read against:
controllers/link_check.py), and how a window and the numbers beside it are saved and read back.
Torch-free.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from autok.controllers.base import BoundaryStats


def network_share(compute: float, exposed: float, peer_wait: float) -> float:
    """The share of the interval's time spent waiting for the network: (exposed − peer wait) /
    (compute + exposed − peer wait). With no peer wait it is the exposed-sync share."""
    network = max(0.0, exposed - peer_wait)
    total = compute + network
    return network / total if total > 0 else 0.0


@dataclass
class Window:
    n: int = 0  # boundaries, for the means
    rounds: int = 0  # rounds closed (BoundaryStats.closes_round): a window's length
    compute: float = 0.0
    exposed: float = 0.0
    drift_ratio: float = 0.0
    loss: float = 0.0
    peer: float = 0.0  # of `exposed`, the wait for a slower rank (BoundaryStats.peer_wait_seconds)
    steps: int = 0
    # each closed round's network seconds, held by the decision window only (LinkCheck.take):
    # its median is the level a round is compared with, which one spike does not move
    per_round: list[float] = field(default_factory=list)
    top: int = 0  # the largest K in force at its boundaries (the guard's: no back-off under it)

    def merge(self, w: Window) -> None:
        """Fold another window's boundaries into this one, as if each had been added here."""
        for name, value in vars(w).items():
            mine = getattr(self, name)
            setattr(self, name, max(mine, value) if name == "top" else mine + value)

    @property
    def network(self) -> float:
        """Seconds waiting for the network (exposed sync less the wait for a slower peer)."""
        return max(0.0, self.exposed - self.peer)

    def closed(self) -> Window:
        """This window as one closed round: its network seconds recorded as the round's."""
        self.per_round = [self.network]
        return self

    def level(self) -> float | None:
        """The median of the rounds' network seconds (None with no rounds recorded)."""
        return statistics.median(self.per_round) if self.per_round else None

    def add(self, s: BoundaryStats) -> None:
        self.n += 1
        self.rounds += s.closes_round
        self.compute += s.compute_seconds
        self.exposed += s.exposed_sync_seconds
        self.drift_ratio += s.drift_ratio
        self.loss += s.train_loss if math.isfinite(s.train_loss) else math.inf
        self.peer += s.peer_wait_seconds
        self.steps += s.interval_steps
        self.top = max(self.top, s.sync_period)

    @property
    def round_steps(self) -> float | None:
        """The mean steps a round: the length the window's share was measured over (K, or less
        where a round was cut short); None with no rounds or no steps counted."""
        return self.steps / self.rounds if self.rounds and self.steps else None

    @property
    def share(self) -> float:
        """The network's share: a wait for a slower peer is neither compute nor link time that
        a larger K amortizes (every K waits for a slow rank alike), so it is left out of both."""
        return network_share(self.compute, self.exposed, self.peer)


def saved_window(saved: dict[str, Any]) -> Window:
    """A saved window; one saved before windows counted rounds had a round per boundary."""
    # one saved before windows kept their largest K: unknown, so the guard judges it as before
    w = Window(**{"rounds": saved.get("n", 0), "top": 2**31, **saved})
    # each a round's network seconds, the level a faster or slower link is read against (inf:
    # a round of an unbounded time, which states saved before the check could hold)
    w.per_round = [round_seconds(x) for x in w.per_round]
    return w


def round_seconds(x: object) -> float:
    """A saved round's network seconds: a number >= 0 (inf allowed), else a ValueError."""
    seconds = saved_number({"per_round": x}, "per_round", inf=True)
    if seconds is None:
        raise ValueError("exposed-sync state: per_round must be a number >= 0, not None")
    return seconds


def saved_number(state: dict[str, Any], key: str, *, inf: bool = False) -> float | None:
    """A saved number >= 0 (or inf, where `inf`), or None where the state has none."""
    v = state.get(key)
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or math.isnan(v)
        or v < 0
        or (math.isinf(v) and not inf)
    ):
        raise ValueError(f"exposed-sync state: {key} must be a number >= 0, not {v!r}")
    return float(v)


def saved_flag(state: dict[str, Any], key: str) -> bool:
    """A saved true or false (false where the state has none)."""
    v = state.get(key, False)
    if type(v) is not bool:
        raise ValueError(f"exposed-sync state: {key} must be true or false, not {v!r}")
    return v


def window_state(w: Window) -> dict[str, Any]:
    """A window's state, its list copied (a snapshot the live window does not change)."""
    return {**vars(w), "per_round": list(w.per_round)}
