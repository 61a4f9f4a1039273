"""The boundary's sums that must come out exact or accurate (trainer/engine/averaging.py).

The scalars that ride at the tail of the averaging buffer (docs/design.md §3: small scalars
ride inside it, no extra round trip), s_i = ||θ_i − θ_ref||² split into float32 pieces that a
SUM over the ranks adds exactly, the drift computed from them, and the squared norms both sides
of that difference need. Pure functions of tensors and numbers: tested without a process group.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from autok.trainer.engine.grad_watch import CHANGED, UNCHECKED

if TYPE_CHECKING:
    from autok.trainer.engine.averaging import IntervalTotals

# Scalar slots at the tail of the buffer. s = ||θ_i − θ_ref||² rides as S_PARTS float32 pieces.
# GRADS_CHECKED, GRADS_CHANGED: the ranks whose boundary step's gradients were checked, and found
# changed, between backward and the optimizer step (trainer/engine/grad_watch.py).
S_PARTS = 4
LOSS_SUM, STEPS, COMPUTE, EXPOSED, DIGEST, DIGEST0, GRADS_CHECKED, GRADS_CHANGED = range(
    S_PARTS, S_PARTS + 8
)
N_SCALARS = S_PARTS + 8
_F32_MAX = float(np.finfo(np.float32).max)  # a float64 within it casts to float32 silently


def split_exact(x: float, world_size: int, parts: int = S_PARTS) -> list[float]:
    """A float64 as `parts` float32 pieces that sum back to it and survive a float32 SUM over
    `world_size` ranks exactly.

    A float32 holds 24 significant bits. Each piece keeps at most 24 − b of them, with
    b = ceil(log2 N) + 1 bits of headroom, so N pieces with one exponent add exactly in any
    order (partial sums included); four pieces cover float64's 53 bits for N up to 512.
    Replicas that agree have identical s_i, so their sum is exact and zero drift reads exactly
    0 (a plain hi/lo split rounds at the third addend: 3·hi needs 26 bits). Pieces of ranks
    whose s_i differ by more than 2^b add with a rounding of 2^-24 of the sum, but then the
    drift itself is of the order of s and that error is negligible.
    """
    keep = 24 - (max(1, world_size - 1).bit_length() + 1)
    out, rest = [], x
    for _ in range(parts - 1):
        if rest == 0.0 or not math.isfinite(rest):
            piece = rest
        else:
            m, e = math.frexp(rest)  # rest = m·2^e, 0.5 <= |m| < 1
            piece = math.ldexp(math.trunc(math.ldexp(m, keep)), e - keep)
        out.append(piece)
        rest = rest - piece if math.isfinite(rest) else 0.0
    out.append(rest)  # at most 53 − (parts − 1)·keep bits: within `keep` while N <= 512
    return out


# Where split_exact's pieces of x are all float32s as they are: each nonzero piece is a run of
# x's bits, so it is at least ulp(x) > 2^-53·x, a normal float32 (above 2^-126) from x >= 2^-73,
# and at most x, far below float32's overflow; its bits fit float32's 24 (the last piece has
# 53 − 3·keep, within 24 up to N = 8192; split_exact's own exactness is for N <= 512, the
# bound kept here). A margin on each side.
_EXACT_LO, _EXACT_HI, _EXACT_WORLD = 2.0**-64, 2.0**120, 512


def write_scalars(
    scalars: torch.Tensor,
    host: np.ndarray | None,
    s: float,
    world_size: int,
    totals: IntervalTotals,
    digest: int,
    rank: int,
) -> None:
    """This rank's scalars, in the slots' order above, into the buffer's tail: `scalars`, or
    `host`, the NumPy view of it where there is one (no torch op). s_i as split_exact's
    pieces; the digest twice, the second from rank 0 only (the SUM's N·digest_0, which the
    replica check compares with Σ digest); the grad_watch verdict as two counts."""
    values = [
        *split_exact(s, world_size),
        totals.loss_sum,
        totals.steps,
        totals.compute_seconds,
        totals.exposed_sync_seconds,
        digest,
        digest if rank == 0 else 0,
        int(totals.grads != UNCHECKED),
        int(totals.grads == CHANGED),
    ]
    if host is not None:  # each value rounded to the dtype as torch.tensor rounds it
        if min(values) >= -_F32_MAX and max(values) <= _F32_MAX:  # nothing can overflow
            host[:] = values  # (a NaN, which the guard may let through, casts silently)
        else:  # np.errstate costs a boundary tens of µs: only where a value may overflow
            with np.errstate(over="ignore"):  # a diverged s or loss becomes inf, as in torch
                host[:] = values
    else:
        scalars.copy_(torch.tensor(values, dtype=scalars.dtype))


def drift_sq_from(reduced_pieces: list[float], world_size: int, update_sq: float) -> float:
    """mean_i ||θ_i − θ_avg||² = mean_i s_i − ||θ_avg − θ_ref||², from the SUM of the ranks'
    split_exact pieces. update_sq goes through the same float32 pieces, so where s_i equals it
    (replicas that agree) the difference is exactly 0, also when tiny pieces round to subnormal
    float32s."""
    if world_size <= _EXACT_WORLD and (_EXACT_LO <= update_sq <= _EXACT_HI or update_sq == 0.0):
        # every piece is a normal float32 (or 0), so rounding it to float32 is exact and the
        # pieces sum back to update_sq: the split below would return it unchanged (that
        # Python runs after the collective's wait, on cold caches)
        update_q = update_sq
    else:
        pieces = split_exact(update_sq, world_size)
        form = f"{len(pieces)}f"  # each piece rounded to float32, as the buffer rounds s_i's
        update_q = math.fsum(struct.unpack(form, struct.pack(form, *pieces)))
    drift_sq = math.fsum(reduced_pieces) / world_size - update_q
    if not drift_sq > 0.0:  # rounding can dip below zero; NaN must stay NaN (divergence)
        drift_sq = 0.0 if math.isfinite(drift_sq) else math.nan
    return drift_sq


class Sums:
    """A 0-dim sum read through NumPy on the CPU, not by `item()`: a torch op fewer for each
    of a small model's boundary sums (after the collective's wait every op costs tens
    of µs on a shared VM). `copy`: a buffer for what is summed, if the caller needs one."""

    def __init__(self, dtype: torch.dtype, copy: torch.Tensor | None = None) -> None:
        self.out = torch.zeros((), dtype=dtype)
        self.host = self.out.numpy()
        self.copy = copy

    def sum(self, x: torch.Tensor) -> Any:
        """x.sum() (in the dtype of `out`) as a Python number, a float or an int as `out`'s
        dtype is (NumPy's item()); x 1-D. Bit for bit `x.sum()`: the same reduction over the
        one dimension."""
        torch.sum(x, dim=0, dtype=self.out.dtype, out=self.out)
        return self.host.item()


# sq_norm: the row length of its one-pass form, and the size from which that form is cheaper
# than squaring into scratch and summing (below it, its extra ops cost more than the pass).
_NORM_ROW = 512
_NORM_ROWS_MIN = 1 << 16


def sq_norm(x: torch.Tensor, scratch: torch.Tensor, into: Sums | None = None) -> float:
    """||x||² of a contiguous 1-D float tensor, for the drift, whose cancellation of two such
    sums needs them accurate: it keeps drift within 1e-5 wherever it is more than a few
    thousandths of the update. Deterministic: replicas that agree compute identical values, so
    zero drift still reads exactly 0.

    A large x is read once: the norms of rows of 512 elements in x's dtype (float32 for a
    float32 model; a sum that short is accurate per lane), squared and summed in float64.
    Measured on 3M and 30M float32 elements: 4e-10 relative error and about half the time of
    squaring into `scratch` and taking the cascade sum (6e-9 to 1e-7), the form used below
    _NORM_ROWS_MIN (summed `into` a kept 0-dim tensor where the caller has one). (One float32
    dot product or `vector_norm` of the whole vector sums sequentially per lane: 1e-5 to 3e-3
    relative error at 3M to 30M elements; a float64 norm pays a conversion pass.)"""
    n = x.numel()
    if n < _NORM_ROWS_MIN:  # (a slice is an op too: not taken where scratch already fits)
        squares = torch.mul(x, x, out=scratch if scratch.numel() == n else scratch[:n])
        return float(squares.sum()) if into is None else into.sum(squares)
    r = n - n % _NORM_ROW
    total = torch.linalg.vector_norm(x[:r].view(-1, _NORM_ROW), dim=1).double().square_().sum()
    if r < n:
        total += x[r:].double().square_().sum()
    return float(total)
