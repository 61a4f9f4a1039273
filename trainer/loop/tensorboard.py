"""`--tensorboard DIR`: the run's scalars as TensorBoard event files (rank 0).

A sink like any other (trainer/loop/sinks.py): an object with `on_boundary(stats, decision)` and
`on_epoch(row)`, the interface a user's own callback has. With `autok.Sync` in a user's loop:
`sync.observers.append(TensorBoardSink("runs/tb"))` (per-boundary scalars; epochs are the
loop's). Boundary scalars are indexed by the optimizer step, epoch scalars by the epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autok.controllers.base import BoundaryStats, SyncDecision

BOUNDARY_SCALARS = (
    "sync_period",
    "compute_seconds",
    "exposed_sync_seconds",
    "sync_share",
    "drift_norm",
    "drift_ratio",
    "update_norm",
    "train_loss",
    "lr",
    "bytes_communicated",
)
EPOCH_SCALARS = (
    "train_loss",
    "train_accuracy",
    "test_accuracy",
    "test_loss",
    "test_metric",
    "epoch_seconds",
    "samples_per_second",
    "sync_seconds",
    "collectives",
    "sync_period",
)


class TensorBoardSink:
    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def on_boundary(self, stats: BoundaryStats, decision: SyncDecision) -> None:
        step = stats.global_step
        for name in BOUNDARY_SCALARS:
            self.writer.add_scalar(f"boundary/{name}", float(getattr(stats, name)), step)
        self.writer.add_scalar("boundary/next_sync_period", decision.next_sync_period, step)

    def on_epoch(self, row: dict[str, Any]) -> None:
        for name in EPOCH_SCALARS:
            if name == "test_metric":  # a task's own metric, under its name
                if "test_accuracy" not in row:
                    tag = f"epoch/test_{row['metric_name']}"
                    self.writer.add_scalar(tag, float(row[name]), row["epoch"])
            elif name in row:
                self.writer.add_scalar(f"epoch/{name}", float(row[name]), row["epoch"])
        self.writer.flush()  # an epoch is visible in TensorBoard as soon as it ends

    def on_stop(self, epoch: int) -> None:
        self.writer.close()

    def on_end(self, summary: dict[str, Any]) -> None:
        self.writer.close()
