"""The built-in loop's evaluation: this rank's slice of the test set as sums, which the epoch's
one all-reduce adds over ranks (trainer/loop/records.py), so the metric is the whole set's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from autok.trainer.loop.epoch_sums import on_device_or_read
from autok.trainer.loop.tasks import Task, loss_fn_of, metric_of


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable[Any], task: Task, device: torch.device
) -> list[float]:
    """This rank's slice of the test set (`loader`) as sums: [metric sum, metric count, loss sum,
    samples]; summed over ranks they give the whole set's metric and mean loss. The model is
    left in training mode."""
    model.eval()
    metric_sum = metric_count = seen = 0.0
    # The sums stay on the model's device and are read once, as in training: a read per
    # batch would drain an accelerator's queue at every batch. In float64, added in batch
    # order: on the CPU the same values as summing the batches' numbers on the host.
    acc = torch.zeros(3, dtype=torch.float64, device=device)
    batch_metric, loss_fn = metric_of(task).batch, loss_fn_of(task)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        total, count = batch_metric(out, y)
        metric_sum += on_device_or_read(acc[0], total)
        metric_count += on_device_or_read(acc[1], count)
        if not task.classifies:  # test_loss is reported beside another metric only
            # the batch's mean times its size, in float64 (an add with alpha may fuse)
            acc[2].add_(loss_fn(out, y).detach().sum().double() * len(y))
        seen += len(y)
    on_device = acc.tolist()
    metric_sum, metric_count = metric_sum + on_device[0], metric_count + on_device[1]
    loss_sum = on_device[2]
    model.train()
    return [metric_sum, metric_count, loss_sum, seen]
