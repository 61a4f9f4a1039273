"""`composite`: the larger of the QSR K and the K that keeps the exposed-sync share under target,
capped by the drift/loss guard and, on skewed data, the soft skew cap
(controllers/exposed_sync.py).
QSR supplies the generalization-driven floor as the LR decays; the share rule supplies the
network-driven floor; the guard caps both before drift hurts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision
from autok.controllers.exposed_sync import ExposedSyncController
from autok.controllers.qsr import QSRController


def next_sync_period(
    qsr_k: int, share_k: int, ceiling: int | None, max_k: int, floor: int = 1
) -> int:
    """The larger of the two rules' K, within the cap and the ceiling, never under the share
    rule's floor (a cap does not take K there)."""
    k = min(max(qsr_k, share_k), max_k)
    return max(floor, min(k, ceiling) if ceiling is not None else k)


@dataclass
class CompositeController:
    share: ExposedSyncController
    qsr: QSRController

    @property
    def sync_period(self) -> int:
        return self.share.sync_period

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        was = self.share.sync_period
        q = self.qsr.observe(stats)
        if stats.warmup:  # the K after warmup: QSR's, not under the share rule's floor
            k = max(q.next_sync_period, self.share.k_floor)
            self.share.sync_period = k
            return SyncDecision(k, "warmup")
        s = self.share.observe(stats)  # judges the share at the K that was actually in force
        share = self.share
        k = next_sync_period(
            q.next_sync_period,
            s.next_sync_period,
            share.k_ceiling(),
            share.max_sync_period,
            share.k_floor,
        )
        self.share.set_sync_period(k, was=was)  # from the K in force, not the share rule's
        source = "qsr" if q.next_sync_period > s.next_sync_period else "share"
        return SyncDecision(k, f"composite ({source}): {s.reason}; qsr K={q.next_sync_period}")

    def set_cut(self, steps: int | None) -> None:
        self.share.set_cut(steps)

    def rollback(self, sync_period: int) -> None:
        self.share.rollback(sync_period)
        self.qsr.rollback(sync_period)

    def state_dict(self) -> dict[str, Any]:
        return {"share": self.share.state_dict(), "qsr": self.qsr.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.share.load_state_dict(state["share"])
        self.qsr.load_state_dict(state["qsr"])
