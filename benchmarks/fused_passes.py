"""Would fused kernels bring a boundary's host passes down? Measured, one process, one thread.

    python -m benchmarks.fused_passes     # -> benchmarks/results/fused_passes.md

Needs a C++ compiler (torch.compile's CPU backend). Bench part (h)'s goal is a boundary within 1.2×
of a bare all-reduce of its buffer. On the 3M-parameter MLP the boundary's own passes over
12 MB vectors cost more than that allows, so this measures what fusing them could save. Per
round, 15 calls of each side, taking turns call by call (the order reverses each call):

- `autok`: `ParameterAverager.reconcile`, the real fused boundary (cpdp, SlowMo β = 0.3, the
  momentum correction; `benchmarks.boundary_parts`'s), on a gloo group of one, where the
  collective costs almost nothing: its host passes alone. The capture of g_i is not timed.
- `compiled`: the same passes written as two functions, one for `start` and one for `finish`,
  compiled by torch.compile (inductor), which fuses elementwise ops and reductions into loops.
- `stream`: one `torch.add(a, b, out=c)` over vectors of the same size: three streams (two
  read, one written). A third of it is the cost of one stream of a vector here.

The fewest streams this boundary needs: `start` reads θ, θ_ref, m, g and v and writes Δ, m and
v (8); `finish` reads ΣΔ, Σg, m, v and θ_ref and writes m, v, θ_ref and θ (9); a fused kernel
takes the norms and the digest from values it holds already. 17 streams at the measured cost
of one is about what a perfectly fused implementation would cost here (a model built on a
measured figure: it is labelled so).
"""

from __future__ import annotations

import math
import os
import platform
import socket
import statistics
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist

from autok.trainer.engine.averaging import IntervalTotals
from benchmarks.boundary_parts import _fused_boundary
from benchmarks.engine import mlp_3m
from benchmarks.stats import MIN_ROUNDS, fmt, ratios, summarize

FLOOR_STREAMS = 17
OUT = Path(__file__).parent / "results" / "fused_passes.md"


def start_passes(theta, ref, m, g, v, head, beta: float) -> torch.Tensor:
    """start(): Δ_i = θ_i − θ_ref into the buffer, ||Δ_i||² (summed in float64), m_i −= g_i,
    v *= β. Written as values and copies, the form inductor fuses into the fewest loops (4
    kernels, against 7 for the same passes written with in-place ops and row norms)."""
    d = theta - ref
    head.copy_(d)
    m.sub_(g)
    v.mul_(beta)
    return (d.double() * d.double()).sum()


def finish_passes(head, sg, m, v, ref, theta, scale: float, inv_n: float):
    """finish(): ||scale·ΣΔ||², SlowMo (v += scale·ΣΔ, θ_ref += v), θ ← θ_ref, m += Σg/N, and
    the digest's wrap-around sum of θ's words (3 kernels compiled). `scale` a power of two, as
    the averager's: v + scale·ΣΔ rounds as its `add_(ΣΔ, alpha=scale)` does."""
    mean = head * scale
    v_new = v + mean
    v.copy_(v_new)
    theta_new = ref + v_new
    ref.copy_(theta_new)
    theta.copy_(theta_new)
    m.add_(sg, alpha=inv_n)
    u = (mean.double() * mean.double()).sum()
    return u, theta_new.view(torch.int32).sum(dtype=torch.int32)


class _Vectors:
    """θ, θ_ref, m, v and the buffer [Δ | g] of one side, all of n float32 elements."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.theta, self.ref, self.m, self.v = (torch.randn(n, generator=gen) for _ in range(4))
        self.buf = torch.randn(2 * n, generator=gen)
        self.head, self.g = self.buf[:n], self.buf[n:]

    def boundary(self, start, finish) -> tuple[float, float, int]:
        """start, then finish on what start left (a group of one: the sum is its own value);
        ||Δ_i||², the update's squared norm and the digest's sum, read on the host as the real
        boundary reads them."""
        s = start(self.theta, self.ref, self.m, self.g, self.v, self.head, 0.3)
        u, digest = finish(self.head, self.g, self.m, self.v, self.ref, self.theta, 1.0, 1.0)
        return float(s), float(u), int(digest)


def _same_work(start, finish, n: int) -> None:
    """The compiled passes compute what the eager ones do (to float32 rounding): a compiler that
    dropped or reordered work would time something else."""
    a, b = _Vectors(n, 1), _Vectors(n, 1)  # one seed: the same values
    (s_a, u_a, digest_a), (s_b, u_b, digest_b) = (
        a.boundary(start_passes, finish_passes),
        b.boundary(start, finish),
    )
    for name in ("theta", "ref", "m", "v", "buf"):
        x, y = getattr(a, name), getattr(b, name)
        if not torch.allclose(x, y, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"compiled passes differ from eager ones in {name}")
    if not (math.isclose(s_a, s_b, rel_tol=1e-6) and math.isclose(u_a, u_b, rel_tol=1e-6)):
        raise AssertionError(f"compiled norms differ: {s_b}, {u_b} against {s_a}, {u_a}")
    if torch.equal(a.theta, b.theta) and digest_a != digest_b:  # the same bits, another sum
        raise AssertionError(f"compiled digest sum {digest_b} against {digest_a}")


def main(rounds: int = MIN_ROUNDS, calls: int = 15) -> None:
    torch.set_num_threads(1)
    with socket.socket() as s:  # a free port for the group of one
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    capture, _, _ = _fused_boundary(mlp_3m((40,), 10))
    averager = capture.__self__
    n = averager.numel
    totals = IntervalTotals(1.0, 1, 0.0, 0.0)
    start_c = torch.compile(start_passes, dynamic=False)
    finish_c = torch.compile(finish_passes, dynamic=False)
    try:  # the first call compiles
        _same_work(start_c, finish_c, n)
    except AssertionError:
        raise
    except Exception as e:  # no compiler, most often: one line, not inductor's traceback
        msg = f"benchmarks.fused_passes: torch.compile failed: {type(e).__name__}: {e}"
        raise SystemExit(msg.splitlines()[0]) from None
    vec = _Vectors(n, 2)
    a, b, c = (torch.randn(n) for _ in range(3))
    # Untimed before each boundary, on both sides: the local steps' move of θ. Without one, θ
    # would equal θ_ref from the second boundary on, and the velocity would decay through
    # subnormal floats (slow on x86) to zero.
    kick = 1e-3 * torch.randn(n)
    kicks = list(kick.split([p.numel() for p in averager.params]))
    kicks = [k.view_as(p) for k, p in zip(kicks, averager.params, strict=True)]

    def autok() -> float:
        with torch.no_grad():
            torch._foreach_add_(averager.params, kicks)
        capture()  # the optimizer pre-hook's copy of g_i: not the boundary's
        t0 = time.perf_counter()
        averager.reconcile(totals, 0.1, None)
        return time.perf_counter() - t0

    grads = averager.fused.segment()[0]  # what capture() writes, the compiled side copies

    def compiled() -> float:
        vec.theta.add_(kick)
        vec.g.copy_(grads)  # as capture() writes g_i on the other side: the same warm cache
        t0 = time.perf_counter()
        vec.boundary(start_c, finish_c)
        return time.perf_counter() - t0

    def stream() -> float:
        t0 = time.perf_counter()
        torch.add(a, b, out=c)
        return time.perf_counter() - t0

    sides = [("autok", autok), ("compiled", compiled), ("stream", stream)]
    for _ in range(3):  # warm every path
        for _, fn in sides:
            fn()
    per_round: dict[str, list[float]] = {name: [] for name, _ in sides}
    for _ in range(rounds):
        times: dict[str, list[float]] = {name: [] for name, _ in sides}
        for i in range(calls):
            for name, fn in sides[:: 1 if i % 2 == 0 else -1]:
                times[name].append(fn())
        for name, ts in times.items():
            per_round[name].append(statistics.median(ts))
    dist.destroy_process_group()
    floor = [FLOOR_STREAMS * t / 3 for t in per_round["stream"]]
    ms = {name: statistics.median(ts) * 1e3 for name, ts in per_round.items()}
    rows = [
        ("autok's boundary, host passes (reconcile on a group of one)", f"{ms['autok']:.2f} ms"),
        ("the passes fused by torch.compile", f"{ms['compiled']:.2f} ms"),
        ("one stream of a vector (a third of a torch.add)", f"{ms['stream'] / 3:.3f} ms"),
        (
            f"the floor: {FLOOR_STREAMS} streams at that cost (a model on the measured stream)",
            f"{statistics.median(floor) * 1e3:.2f} ms",
        ),
        ("**compiled / autok**", fmt(summarize(ratios(per_round["compiled"], per_round["autok"])))),
        ("autok / the floor", fmt(summarize(ratios(per_round["autok"], floor)))),
    ]
    when = datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "# Fused boundary passes (python -m benchmarks.fused_passes)",
        "",
        f"{when}, {os.cpu_count()} CPUs, {platform.platform()}, torch {torch.__version__}, one "
        f"thread; the 3M-parameter MLP ({n:,} float32 elements a vector), {rounds} rounds x "
        f"{calls} calls a side, medians; ratios: median of the per-round ratios (min–max).",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
