"""The divergence guard on a run whose loss swings far and recovers, at several factors F.

    python -m benchmarks.guard_swing     # about a minute -> benchmarks/results/guard_swing.md

The run is the autok side of `autok bench` (g): cpdp K = 8 on mnist1d (the default config's
data, model and optimizer), world 2, link none, 128 epochs at a constant LR. Its loss falls
near zero and then swings up by 20x and more and back, again and again. The guard judges
nothing here (`_times_only`, as in the bench): the per-boundary losses are recorded and each
factor's guard is run on them afterwards, so one run serves every F. Printed per F: the
boundaries the guard would judge diverged (a run stops at the first), and the first of them.
"""

from __future__ import annotations

import os
import statistics
from datetime import datetime
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from autok.config import TrainConfig
from autok.controllers.base import BoundaryStats
from autok.launch import prepare_data, run_workers
from autok.trainer.engine.divergence import DivergenceGuard
from autok.trainer.engine.optim import build_scheduler
from autok.trainer.loop.data import build_splits
from autok.trainer.loop.models import build_model
from benchmarks.engine import _times_only

EPOCHS = 128  # (g)'s: 16 epochs per round, 7 rounds and a first, untimed block
FACTORS = (2.0, 4.0, 5.0, 8.0, 16.0)
OUT = Path(__file__).parent / "results" / "guard_swing.md"


def _losses(rank: int, world: int, cfg_json: str, epochs: int) -> list[tuple[int, float]]:
    """(boundary, mean train loss over the ranks) of every boundary of the run."""
    import autok

    cfg = TrainConfig.model_validate_json(cfg_json)
    splits = build_splits(cfg.dataset, mnist1d_samples=cfg.mnist1d_samples)
    sampler = DistributedSampler(splits.train, world, rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, splits.meta.input_shape, splits.meta.num_classes)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    sched = build_scheduler(opt, epochs * len(loader), len(loader), "constant")
    sync = autok.Sync(model, opt, strategy="cpdp", sync_period=cfg.sync_period, link="none")
    _times_only(sync)  # the guards below judge the recorded losses, every F on the same run
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            with sync.step() as s:
                opt.zero_grad(set_to_none=True)
                loss = criterion(sync.model(x), y)
                loss.backward()
                opt.step()
                s.loss = loss
            if s.is_boundary:
                b = sync.last_boundary
                losses.append((b.boundary, b.train_loss))
            sched.step()
    sync.close()
    return losses


def judged(losses: list[tuple[int, float]], factor: float) -> list[int]:
    """The boundaries a guard with this factor judges diverged, fed the run's losses."""
    guard = DivergenceGuard(factor=factor)
    fields = dict.fromkeys(f.name for f in BoundaryStats.__dataclass_fields__.values())
    out = []
    for boundary, loss in losses:
        values = {"boundary": boundary, "drift_norm": 0.0, "update_norm": 0.0, "train_loss": loss}
        if guard.check(BoundaryStats(**(fields | values))):
            out.append(boundary)
    return out


def main() -> None:
    cfg = TrainConfig(strategy="cpdp", sync_period=8, link="none", workers=2, progress=False)
    prepare_data(cfg)
    losses = run_workers(_losses, 2, cfg.model_dump_json(), EPOCHS, timeout=1800)[0]
    # the loss over the 4 boundaries that end at each boundary, as the guard takes it
    windows = {
        losses[i + 3][0]: statistics.fmean(x for _, x in losses[i : i + 4])
        for i in range(len(losses) - 3)
    }
    first = judged(losses, 4.0)
    stop = first[0] if first else float("inf")
    before = [w for b, w in windows.items() if b < stop]
    after = [w for b, w in windows.items() if b > stop]
    lines = [
        "# The divergence guard on a swinging loss (python -m benchmarks.guard_swing)",
        "",
        f"{datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, torch {torch.__version__}. "
        f"cpdp K = 8, world 2, {EPOCHS} epochs at a constant LR: {len(losses)} boundaries. "
        f"Loss over 4 boundaries: first {before[0]:.4g}; lowest before F = 4's first stop "
        f"{min(before):.4g}, highest after it {max(after, default=float('nan')):.4g}, lowest "
        f"after it {min(after, default=float('nan')):.4g}.",
        "",
        "| F | boundaries judged diverged | first |",
        "|---|---|---|",
    ]
    for factor in FACTORS:
        stops = judged(losses, factor)
        lines.append(f"| {factor:g} | {len(stops)} | {stops[0] if stops else '-'} |")
    lines.append("")
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
