"""Per-interval and per-epoch time accounting (DESIGN §3).

Local to one rank; the boundary collective and the epoch-end reduction make the numbers global.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch


def clock(device: torch.device) -> Callable[[], float]:
    """perf_counter that, on a GPU, first waits for queued kernels so spans mean compute. On
    the CPU it is perf_counter itself: a step reads the clock five times, and a Python wrapper
    around it costs a call each (issue 17)."""
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return now


@dataclass
class Interval:
    """Open boundary interval on this rank."""

    steps: int = 0
    loss_sum: float = 0.0
    compute_seconds: float = 0.0
    exposed_sync_seconds: float = 0.0  # gradient waits, plus the previous boundary's averaging
    grad_bytes: int = 0
    samples: int = 0  # this rank's
    grad_syncs: int = 0


@dataclass
class EpochTimes:
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0  # backward compute only; the wait for buckets is sync
    optimizer_seconds: float = 0.0
    sync_seconds: float = 0.0  # exposed: gradient waits + parameter averaging
    epoch_seconds: float = 0.0
    train_loss_sum: float = 0.0
    train_correct: float = 0.0  # the metric's sum over training batches (classification)
    train_counted: float = 0.0  # and its count (targets, not samples: a target per token...)
    train_seen: float = 0.0
    steps: float = 0.0

    def values(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
