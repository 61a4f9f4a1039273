"""`fixed`: K stays as given."""

from __future__ import annotations

from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision


def next_sync_period(current: int) -> int:
    return current


class FixedController:
    def __init__(self, sync_period: int) -> None:
        self.sync_period = sync_period

    def observe(self, stats: BoundaryStats) -> SyncDecision:
        return SyncDecision(next_sync_period(self.sync_period), "fixed")

    def rollback(self, sync_period: int) -> None:
        """The trainer rolled back after divergence and halved K: keep the smaller K."""
        self.sync_period = sync_period

    def state_dict(self) -> dict[str, Any]:
        return {"sync_period": self.sync_period}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sync_period = int(state["sync_period"])
