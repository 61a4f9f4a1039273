"""Per-interval and per-epoch time accounting (docs/design.md §4).

Local to one rank; the boundary collective and the epoch-end reduction make the numbers global.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch


def clock(device: torch.device) -> Callable[[], float]:
    """perf_counter that, on a GPU, first waits for queued kernels so spans mean compute: for
    spans read rarely (an epoch's wall time). On the CPU it is perf_counter itself. A step's own
    clock points use DeviceMarks on a GPU instead: a device sync at each would stall the queue
    five times a step (docs/design.md §4, Per step)."""
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return now


# A step's clock points, in order: its start, the end of its last forward, the end of backward
# (the optimizer step's start), the optimizer step's end, the step's close.
T0, T1, T2, T3, END = range(5)


class DeviceMarks:
    """A step's clock points on a GPU: CUDA events recorded on the stream that is current when
    the step passes each point, read once, at the step's close. Events mark when the device got
    there, not when the host queued the work, with one host sync per step instead of one per
    point. The events are reused from step to step: a step's are read before the next records.

    `event` makes one timing event (tests pass a stand-in; the default is a CUDA event)."""

    def __init__(self, device: torch.device, event: Callable[[], Any] | None = None) -> None:
        self.device = device
        make = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.events = [make() for _ in range(END + 1)]
        self.recorded = [False] * (END + 1)

    def _stream(self) -> Any:
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

    def start(self) -> None:
        self.recorded = [False] * (END + 1)
        self.mark(T0)

    def mark(self, point: int) -> None:
        self.events[point].record(self._stream())
        self.recorded[point] = True

    def close(self) -> tuple[float, float, float, Any]:
        """The step's forward, backward (compute and any wait for gradients) and optimizer
        seconds on the device, and the event that ends backward (for GradSyncState's wait).
        Points the step never reached fall back as `Sync._close_step`'s host times do: no
        forward through `sync.model` gives a zero forward, a skipped optimizer step (GradScaler)
        ends backward at the close."""
        self.mark(END)
        ev, seen = self.events, self.recorded
        used = [ev[i] for i in range(END + 1) if seen[i]]
        for e in used:  # each on its own stream; an event already reached returns at once
            e.synchronize()
        t0 = ev[T0]
        t1 = ev[T1] if seen[T1] else t0
        t2 = ev[T2] if seen[T2] else ev[END]
        t3 = ev[T3] if seen[T3] else t2
        return (
            t0.elapsed_time(t1) / 1e3,
            t1.elapsed_time(t2) / 1e3,
            t2.elapsed_time(t3) / 1e3,
            t2,
        )


@dataclass(slots=True)
class Interval:
    """Open boundary interval on this rank. (Slots: made and updated at every step.)"""

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
