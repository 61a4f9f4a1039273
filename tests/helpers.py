from __future__ import annotations

from autok.config import TrainConfig


def tiny_cfg(**overrides) -> TrainConfig:
    """A run small enough for a test: 400 mnist1d training samples, no emulated link."""
    base = dict(
        dataset="mnist1d",
        mnist1d_samples=500,
        epochs=2,
        warmup_epochs=1,
        batch_size=32,
        link="none",
        progress=False,
        workers=2,
    )
    base.update(overrides)
    if base["dataset"] != "mnist1d" and "mnist1d_samples" not in overrides:
        del base["mnist1d_samples"]  # mnist1d's alone: refused with another data set
    return TrainConfig(**base)


def expected_boundaries(steps_per_epoch: int, epochs: int, warmup: int, k: int) -> list[bool]:
    """docs/design.md §2: every step in warmup; after K steps; the last step of every epoch."""
    out = []
    for epoch in range(epochs):
        since = 0
        for i in range(steps_per_epoch):
            since += 1
            b = epoch < warmup or since >= k or i == steps_per_epoch - 1
            out.append(b)
            if b:
                since = 0
    return out
