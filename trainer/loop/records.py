"""The run's records (docs/design.md §7): each epoch's row of epochs.csv, gathered over ranks in
one all-reduce with the replica check and the test set's sums, and summary.json's fields at the
run's end; and the totals they add up over epochs, which every checkpoint saves."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autok.trainer.engine.averaging import ReplicaMismatch
from autok.trainer.engine.digest import param_digest
from autok.trainer.engine.link import allreduce_sum_
from autok.trainer.engine.profiler import EpochTimes
from autok.trainer.loop.evaluation import evaluate
from autok.trainer.loop.tasks import Task, metric_of

if TYPE_CHECKING:  # the CLI's config is a SyncOptions with the run's settings; no import cycle
    from autok.config import TrainConfig
    from autok.trainer.engine.sync import Sync


class RunRecords:
    """The records of one rank's run: `end_epoch` (every rank: a collective) gives the epoch's
    row and adds to the totals; `summary` (every rank) gives summary.json's fields."""

    def __init__(
        self,
        sync: Sync,
        model: nn.Module,
        task: Task,
        test_loader: Iterable[Any],
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.sync, self.model, self.task, self.test_loader = sync, model, task, test_loader
        self.rank, self.world_size, self.device = rank, world_size, device
        self.total_compute = 0.0  # mean over ranks, summed over epochs
        self.total_exposed = 0.0
        self.history: list[float] = []  # the test metric per epoch
        # the time of attempts divergence rollbacks discarded (docs/design.md §7, "a rollback's
        # time"): in total, and what the next epoch's row has still to book
        self.rolled_back = 0.0
        self.unbooked = 0.0

    def book_rollback(self, seconds: float) -> None:
        """A rollback discarded an attempt of `seconds` on the records' clock: it is booked to
        the epoch trained next, which the run reached that much later."""
        self.rolled_back += max(0.0, seconds)
        self.unbooked += max(0.0, seconds)

    def restore_rollbacks(self, total: float) -> None:
        """A checkpoint's total of rolled-back time. Nothing is unbooked at a checkpoint, taken
        after its epoch's row: an attempt booked since is dropped with it, and a second rollback
        to the same checkpoint measures its time from there, the first attempt's included."""
        self.rolled_back, self.unbooked = total, 0.0

    def end_epoch(
        self,
        epoch: int,
        times: EpochTimes,
        counts0: tuple[int, int, int],
        sync_period: int,
        lr: float,
    ) -> dict[str, Any]:
        """The epoch's row of epochs.csv; `counts0`: grad syncs, param syncs and collectives
        at the epoch's start; `sync_period`: the K in force; `lr`: its last step's LR."""
        grad_syncs0, param_syncs0, collectives0 = counts0
        times.epoch_seconds += self.unbooked  # (book_rollback)
        self.unbooked = 0.0
        digest = param_digest(list(self.model.parameters()), 32)  # exact in float64
        evaluated = evaluate(self.model, self.test_loader, self.task, self.device)
        local = [digest, digest if self.rank == 0 else 0.0, *evaluated, *times.values()]
        buf = torch.tensor(local, dtype=torch.float64, device=self.device)
        allreduce_sum_(buf, self.sync.clock)
        red = buf.tolist()
        n = self.world_size
        if red[0] != n * red[1]:
            raise ReplicaMismatch(f"replicas differ at the end of epoch {epoch}")
        metric_sum, metric_count, test_loss_sum, test_seen = red[2:6]
        # A metric that counted nothing has no value (not a perfect score).
        test_metric = (
            metric_of(self.task).value(metric_sum / metric_count) if metric_count > 0 else math.nan
        )
        t = dict(zip(EpochTimes.names(), [v / n for v in red[6:]], strict=True))
        self.total_compute += t["forward_seconds"] + t["backward_seconds"] + t["optimizer_seconds"]
        self.total_exposed += t["sync_seconds"]
        seen = t["train_seen"] * n
        overhead = t["epoch_seconds"] - t["forward_seconds"] - t["backward_seconds"]
        overhead -= t["sync_seconds"]
        quality = (
            {
                "train_accuracy": t["train_correct"] / max(t["train_counted"], 1e-300),
                "test_accuracy": test_metric,
            }
            if self.task.classifies
            else {"test_loss": test_loss_sum / max(test_seen, 1.0)}
        )
        self.history.append(test_metric)
        return {
            "epoch": epoch,
            "train_loss": t["train_loss_sum"] * n / seen,
            **quality,
            "test_metric": test_metric,
            "metric_name": metric_of(self.task).name,
            "epoch_seconds": t["epoch_seconds"],
            "samples_per_second": seen / t["epoch_seconds"],
            "forward_seconds": t["forward_seconds"],
            "backward_seconds": t["backward_seconds"],
            "sync_seconds": t["sync_seconds"],
            # Optimizer step, data loading and bookkeeping.
            "overhead_seconds": overhead,
            "grad_syncs": self.sync.grad_syncs - grad_syncs0,
            "param_syncs": self.sync.param_syncs - param_syncs0,
            "collectives": self.sync.collectives - collectives0,
            "sync_period": sync_period,
            "lr": lr,
        }

    def summary(self, cfg: TrainConfig, wall: float, out_dir: Path | None) -> dict[str, Any]:
        """summary.json (docs/design.md §7): the test metric's history, the totals, the engine's
        counts and K path, and every rank's replica digest."""
        n, history = self.world_size, self.history
        # One slot per rank: each writes its own digest, the SUM gathers them (exact in float64).
        slots = torch.zeros(n, dtype=torch.float64, device=self.device)
        slots[self.rank] = param_digest(list(self.model.parameters()), 32)
        allreduce_sum_(slots, self.sync.clock)
        metric = metric_of(self.task)
        scored = [v for v in history if not math.isnan(v)]
        best = math.nan if not scored else max(scored) if metric.higher_is_better else min(scored)
        quality: dict[str, Any] = {
            "metric": metric.describe(),
            "peak_test_metric": best,
            "final_test_metric": history[-1],
        }
        if self.task.classifies:
            quality |= {"peak_test_accuracy": best, "final_test_accuracy": history[-1]}
        return {
            "strategy": cfg.strategy,
            "policy": cfg.policy,
            "world_size": n,
            **quality,
            "wall_seconds": wall,
            "compute_seconds": self.total_compute,
            "exposed_sync_seconds": self.total_exposed,
            "boundaries": self.sync.boundary,
            "grad_syncs": self.sync.grad_syncs,
            "param_syncs": self.sync.param_syncs,
            "collectives": self.sync.collectives,
            "final_sync_period": self.sync.sync_period,
            "k_path": [{"sync_period": k, **v} for k, v in self.sync.k_path.items()],
            "param_digest_per_rank": [int(v) for v in slots.tolist()],
            "link": cfg.link_name,
            "out_dir": str(out_dir) if out_dir else "",
            "rolled_back_seconds": self.rolled_back,
        }
