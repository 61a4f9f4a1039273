"""One epoch's training sums, as the built-in loop adds them up step by step: the step times, the
training loss and (classification) the metric's sums over the training batches.

On the CPU each step's numbers are read at once (a read is cheaper than an op there); tensors on
an accelerator are summed there and read once, at the epoch's end, so that the loop adds no host
sync per step (docs/design.md §4; Sync's close has its one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from autok.trainer.engine.profiler import EpochTimes

if TYPE_CHECKING:
    from autok.trainer.engine.step import StepTimes


class TrainSums:
    """The epoch's `EpochTimes` as it fills, and the device's sums not yet read: loss sum,
    metric sum and metric count (float64; None on the CPU, where every step is read)."""

    def __init__(self, device: torch.device) -> None:
        self.times = EpochTimes()
        self.acc = (
            None if device.type == "cpu" else torch.zeros(3, dtype=torch.float64, device=device)
        )

    @property
    def on_host(self) -> bool:
        """Every step read on the host (the CPU): the loop may read the clock every step too."""
        return self.acc is None

    def add(self, step: StepTimes, loss: torch.Tensor, samples: int, scored: Any) -> None:
        """One step: its times, its loss (the batch's mean) and, where the task classifies, its
        metric's (sum, count) as the metric's `batch` returned them (`scored`; else None: another
        metric is judged on the test set only)."""
        times = self.times
        times.forward_seconds += step.forward_seconds
        times.backward_seconds += step.backward_seconds
        times.optimizer_seconds += step.optimizer_seconds
        times.sync_seconds += step.sync_seconds
        if self.acc is None:
            times.train_loss_sum += loss.item() * samples
            if scored is not None:
                total, count = scored
                times.train_correct += float(total)
                times.train_counted += float(count)
        else:
            self.acc[0].add_(loss.detach().sum(), alpha=samples)  # a loss of shape [1] too
            if scored is not None:
                total, count = scored
                times.train_correct += on_device_or_read(self.acc[1], total)
                times.train_counted += on_device_or_read(self.acc[2], count)
        times.train_seen += samples
        times.steps += 1

    def read(self) -> EpochTimes:
        """The epoch's times and sums, the device's added: on an accelerator the epoch's one
        device sync (the loop reads its end on the clock just before)."""
        if self.acc is not None:
            loss_sum, correct, counted = self.acc.tolist()
            self.times.train_loss_sum += loss_sum
            self.times.train_correct += correct
            self.times.train_counted += counted
        return self.times


def on_device_or_read(slot: torch.Tensor, x: Any) -> float:
    """A metric's per-batch value with no host sync: a tensor on slot's device is added to slot
    there (0.0 returned); a number, or a tensor elsewhere (a metric computed on the CPU), is
    returned as a float for the host's sum (a kernel launch would cost more than the add)."""
    if isinstance(x, torch.Tensor) and x.device == slot.device:
        slot.add_(x.detach().sum())
        return 0.0
    return float(x)
