"""What ddp's fast close (trainer/engine/ddp_path.py, `close_ddp_lazily`) saves a ddp step, hot,
in one process (docs/design.md §4):

    python -m benchmarks.ddp_close [--rounds 7] [--steps 2000]

Two `autok.Sync` ddp instances on a gloo group of one, a 2-layer MLP each, take turns step by
step; one is sent down the general close (its fast path turned off). Printed: per round, the
median step of the general one minus that of the fast one, in µs, and their median. A
one-process figure (no wait for another rank, caches warm): `autok bench --only a` measures the
step against plain DDP at world 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


def _sync(general: bool):
    import autok

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sync = autok.Sync(model, opt, strategy="ddp", link="none")
    return sync, opt, general


def _never(*args: object) -> bool:
    """The fast close turned off: every step takes the general path."""
    return False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ddp_close")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2000, help="steps per side per round")
    args = ap.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    fast, general = _sync(False), _sync(True)
    crit = nn.CrossEntropyLoss()
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])

    import autok.trainer.engine.sync as engine

    fast_close = engine.close_ddp_lazily

    def step(side, times: list[float]) -> None:
        sync, opt, general = side
        # the Sync calls its module's close_ddp_lazily: swapped for the general side's step only
        engine.close_ddp_lazily = _never if general else fast_close  # type: ignore[assignment]
        t0 = time.perf_counter()
        with sync.step() as s:
            opt.zero_grad(set_to_none=True)
            loss = crit(sync.model(x), y)
            loss.backward()
            opt.step()
            s.loss = loss
        times.append(time.perf_counter() - t0)

    saved = []
    for r in range(args.rounds + 1):  # round 0 warms up
        tf, tg = [], []
        for i in range(args.steps):
            order = ((fast, tf), (general, tg)) if i % 2 else ((general, tg), (fast, tf))
            for side, times in order:
                step(side, times)
        if r:
            saved.append((statistics.median(tg) - statistics.median(tf)) * 1e6)
    dist.destroy_process_group()
    rounds = " ".join(f"{v:+.1f}" for v in saved)
    median = statistics.median(saved)
    print(f"general close - fast close, µs a step: {rounds}; median {median:+.1f}")


if __name__ == "__main__":
    main()
