"""What a K policy sees and says. Pure data: no torch, no torch.distributed.

Every rank runs the same controller on the same, already-reduced `BoundaryStats`, so every rank
reaches the same `SyncDecision` without a collective of its own (docs/design.md §3).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class BoundaryStats:
    """One boundary interval, reduced over ranks (means unless noted).

    The interval of boundary b runs from the instant boundary b-1 packed its averaging buffer to
    the instant boundary b packs its own, so the parameter averaging of b-1 is counted in b's
    record: every second lands in exactly one record, and all fields are known before the
    collective that carries them.
    """

    boundary: int
    global_step: int
    epoch: int
    sync_period: int  # K in force for this interval
    interval_steps: int  # optimizer steps in this interval (< K at an epoch end)
    compute_seconds: float
    exposed_sync_seconds: float
    drift_norm: float
    update_norm: float
    drift_ratio: float
    train_loss: float
    bytes_communicated: int
    lr: float
    warmup: bool
    # Interval counts, all ranks (for counters): samples, gradient AllReduces, averagings.
    samples: int = 0
    grad_syncs: int = 0
    param_syncs: int = 0
    link: str = ""  # the link profile in force at the boundary (a --link-schedule moves it)
    # The fragment this boundary synced (--fragments F: 0..F-1), or -1: the whole model (F = 1,
    # an epoch's end, sync_now(), warmup, K below F). bytes_communicated counts what it moved.
    fragment: int = -1
    # Of exposed_sync_seconds, the part spent waiting for a slower rank to reach the collective
    # rather than for the network (trainer/engine/clock.py). Booked on the virtual clock; 0 on
    # the wall clock, where the ranks' arrival times are not exchanged (docs/design.md §6).
    peer_wait_seconds: float = 0.0

    @property
    def closes_round(self) -> bool:
        """Whether this boundary ends a round: the whole model synced, or fragment 0, the last
        of a round's order 1, 2, …, F−1, 0 (docs/design.md §2, Fragments). A controller's
        window counts rounds, so that with F fragments it spans as many steps, and its drift is
        compared over the same intervals, as without them, not F-times-shorter ones."""
        return self.fragment <= 0

    @property
    def sync_share(self) -> float:
        """Exposed-sync share f = exposed / (compute + exposed) of this interval."""
        total = self.compute_seconds + self.exposed_sync_seconds
        return self.exposed_sync_seconds / total if total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SyncDecision:
    next_sync_period: int
    reason: str


@runtime_checkable
class Controller(Protocol):
    @property
    def sync_period(self) -> int:
        """The K in force: the engine reads it before the first boundary."""
        ...

    def observe(self, stats: BoundaryStats) -> SyncDecision: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def rollback(self, sync_period: int) -> None:
        """Training rolled back after divergence with K halved to `sync_period`; continue from
        it and do not climb straight back."""
        ...


@runtime_checkable
class KnowsCuts(Protocol):
    """A controller that reads where the engine cuts rounds short (every epoch's end, in the
    built-in loop): `Sync.period_cap` tells it, and again whenever it changes."""

    def set_cut(self, steps: int | None) -> None: ...
