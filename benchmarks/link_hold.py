"""How late a hold of the link emulator returns, and what the work after a hold costs; one
process, pinned to one core.

    python -m benchmarks.link_hold

1. `time.sleep` to a deadline against `autok.trainer.engine.link.hold_until` (a sleep, then
HOLD_POLL seconds
   polling the clock): the median, 90th percentile and maximum lateness, in µs, over 200 holds
   of 17 ms (about T(S, N) of the cnn1d's fused boundary on `wan` at world 2).
2. The same few torch ops a boundary runs after its collective (a squared norm, two adds, a
   copy, an integer sum, on the cnn1d's 12,810 floats), back to back and right after a 17 ms
   hold: the median time of the sequence. Where the second is many times the first, the
   machine evicts a waiting process's code and data from the caches (a shared VM), and any
   boundary's work after its wait pays that: it is the floor under (i)'s exposed time beyond T.
   Then the same ops in NumPy, on the same memory. (Tried and dropped: a boundary whose finish ran
   in NumPy on the CPU saved about 0.1 ms after the wait, but its NumPy norm in the start, whose
   code had cooled during the local steps, cost about as much: not landed.)

A rough guide on a shared machine; `autok bench --only i` measures the emulator in place
(collective held / T) and the exposed time of a whole boundary.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

from autok.trainer.engine.link import hold_until


def _late(hold, n: int = 200, seconds: float = 0.017) -> list[float]:
    out = []
    for _ in range(n):
        deadline = time.perf_counter() + seconds
        hold(deadline)
        out.append(time.perf_counter() - deadline)
    return sorted(out)


def _sleep(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


def _after_hold(n: int = 100, host: bool = False) -> tuple[float, float]:
    """The median seconds of a boundary's post-collective ops, back to back and after a hold;
    `host`: the same ops in NumPy, on the same memory."""
    x = torch.randn(12_810)
    y, scratch = x.clone(), torch.empty_like(x)
    words = x.view(torch.int32)
    xa, ya, sa, wa = x.numpy(), y.numpy(), scratch.numpy(), words.numpy()

    def ops() -> float:
        t0 = time.perf_counter()
        float(torch.mul(x, x, out=scratch).sum())
        y.add_(x, alpha=0.5)
        y.add_(scratch)
        torch._foreach_copy_([scratch], [y])
        int(words.sum(dtype=torch.int32))
        return time.perf_counter() - t0

    def host_ops() -> float:
        t0 = time.perf_counter()
        float(np.multiply(xa, xa, out=sa).sum())
        np.add(ya, np.multiply(xa, 0.5, out=sa), out=ya)
        np.add(ya, sa, out=ya)
        np.copyto(sa, ya)
        int(wa.sum(dtype=np.int32))
        return time.perf_counter() - t0

    fn = host_ops if host else ops
    hot = [fn() for _ in range(n)]
    cold = []
    for _ in range(n):
        hold_until(time.perf_counter() + 0.017)
        cold.append(fn())
    return statistics.median(hot), statistics.median(cold)


def main() -> None:
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for name, hold in (("time.sleep", _sleep), ("hold_until", hold_until)):
        late = _late(hold)
        print(
            f"{name:12s} late by: median {statistics.median(late) * 1e6:7.1f} µs, "
            f"p90 {late[int(0.9 * len(late))] * 1e6:7.1f} µs, max {late[-1] * 1e6:7.1f} µs"
        )
    for name, host in (("torch", False), ("NumPy", True)):
        hot, cold = _after_hold(host=host)
        print(
            f"a boundary's post-collective ops in {name}, back to back: {hot * 1e6:7.1f} µs; "
            f"after a 17 ms hold: {cold * 1e6:7.1f} µs ({cold / hot:.0f}x)"
        )


if __name__ == "__main__":
    main()
