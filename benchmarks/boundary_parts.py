"""The parts of the boundary's hot path that were made cheaper, old way against new, one process,
one thread.

    python -m benchmarks.boundary_parts

Per part: the median of 15 timed calls, in µs (a rough guide on a shared machine: the ratios in
`autok bench` are the measurements that count). Parts: the replica check (CRC32 of every byte on
the host against `replica_digest`), one norm (float64 `vector_norm`, squaring in place and
summing, `sq_norm`'s row norms) on a 3M-parameter MLP; ddp's parameter check (`params_finite`)
on the cnn1d; one gradient-bucket
allreduce through `dist.all_reduce` against the process group's own, on a gloo group of one; and
a whole fused cpdp boundary (SlowMo β = 0.3, the default) on the cnn1d and the 3M-parameter MLP,
on that group of one, where the collective costs almost nothing: its CPU cost, `autok bench`
(h)'s excess without a second rank competing for memory. Then the torch ops (dispatched, views
included) of the cnn1d's fused boundary: its capture of g_i, start (with the collective) and
finish, counted with a TorchDispatchMode; after a wait every op runs on cold caches here
(`python -m benchmarks.link_hold`), so the count matters where the hot µs above do not show it.
Compare two checkouts by running this file from each.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from autok.trainer.engine.averaging import IntervalTotals, ParameterAverager
from autok.trainer.engine.digest import param_digest, replica_digest
from autok.trainer.engine.divergence import params_finite
from autok.trainer.engine.exact_sums import N_SCALARS, sq_norm
from autok.trainer.engine.outer import OuterOptimizer
from autok.trainer.loop.models import build_model
from benchmarks.engine import mlp_3m


def _us(fn, reps: int = 15) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    big = [p.detach() for p in mlp_3m((40,), 10).parameters()]
    flat = torch.cat([p.reshape(-1) for p in big])
    ref = flat + 1e-3 * torch.randn_like(flat)
    scratch = torch.empty_like(flat)
    small = [p.detach() for p in build_model("cnn1d", (40,), 10).parameters()]
    rows = [
        ("replica check, 3M params: CRC32", _us(lambda: param_digest(big, 23))),
        ("replica check, 3M params: replica_digest", _us(lambda: replica_digest(big, 23))),
        (
            "one norm, 3M params: sub + float64 vector_norm",
            _us(
                lambda: torch.linalg.vector_norm(
                    torch.sub(flat, ref, out=scratch), dtype=torch.float64
                ).item()
            ),
        ),
        (
            "one norm, 3M params: sub + square in place + sum",
            _us(lambda: float(torch.sub(flat, ref, out=scratch).square_().sum())),
        ),
        (
            "one norm, 3M params: sub + sq_norm (row norms)",
            _us(lambda: sq_norm(torch.sub(flat, ref, out=scratch), scratch)),
        ),
        ("ddp parameter check, cnn1d: params_finite", _us(lambda: params_finite(small), 200)),
    ]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    bucket = torch.randn(25_000)
    group = dist.distributed_c10d._get_default_group()
    rows += [
        (
            "bucket allreduce: dist.all_reduce",
            _us(lambda: dist.all_reduce(bucket, async_op=True).get_future().wait(), 2000),
        ),
        (
            "bucket allreduce: the process group's allreduce",
            _us(lambda: group.allreduce([bucket]).get_future().wait(), 2000),
        ),
    ]
    for name, model in (("cnn1d", build_model("cnn1d", (40,), 10)), ("3M MLP", mlp_3m((40,), 10))):
        capture, boundary, bare = _fused_boundary(model)
        reps = 200 if name == "cnn1d" else 15
        rows.append((f"fused boundary, {name}: capture g_i", _us(capture, reps)))
        rows.append((f"fused boundary, {name}: capture g_i + boundary", _us(boundary, reps)))
        rows.append((f"fused boundary, {name}: bare all_reduce", _us(bare, reps)))
    counts = _op_counts(build_model("cnn1d", (40,), 10))
    dist.destroy_process_group()
    for name, us in rows:
        print(f"{name:50s} {us:10.1f} µs")
    for name, ops in counts:
        print(f"{name:50s} {ops:10d} ops")


class _OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _op_counts(model: torch.nn.Module) -> list[tuple[str, int]]:
    """The torch ops of one fused boundary of `model` (after two to warm its caches), by part."""
    capture, boundary, _ = _fused_boundary(model)
    boundary()
    boundary()
    averager = capture.__self__
    counts = []
    with _OpCount() as count:
        capture()
    counts.append(("fused boundary, cnn1d: ops of capture g_i", count.ops))
    with _OpCount() as count:
        pending = averager.start(IntervalTotals(1.0, 1, 0.0, 0.0), 0.1, None, overlap=False)
    counts.append(("fused boundary, cnn1d: ops of start (with all_reduce)", count.ops))
    with _OpCount() as count:
        averager.finish(pending)
    counts.append(("fused boundary, cnn1d: ops of finish", count.ops))
    return counts


def _fused_boundary(model: torch.nn.Module):
    """The capture of g_i (an optimizer pre-hook's work, not the boundary's), a fused boundary of
    `model` (capture, start and finish), and a bare all_reduce of a buffer of its size."""
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    opt.step()  # creates the momentum buffers the correction updates
    averager = ParameterAverager(
        params, rank=0, world_size=1, outer=OuterOptimizer("slowmo", 1.0, 0.3), fused_sgd=opt
    )
    flat = torch.randn(2 * averager.numel + N_SCALARS)
    totals = IntervalTotals(1.0, 1, 0.0, 0.0)

    def boundary() -> None:
        averager.capture_boundary_grads()
        averager.reconcile(totals, 0.1, None)

    return averager.capture_boundary_grads, boundary, lambda: dist.all_reduce(flat)


if __name__ == "__main__":
    main()
